// The analysis of an attempt's flight recorder dumps (docs/diagnose.md):
// which ranks are behind and where the others wait for them. Pure functions
// over the dumps' text and what the caller knows of the attempt; it sends no
// signal and looks at no process itself (AttemptFacts::process_state does).
#ifndef PTRAIN_COORDINATOR_FLIGHT_ANALYSIS_H_
#define PTRAIN_COORDINATOR_FLIGHT_ANALYSIS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/confined_fs.h"
#include "nlohmann/json.hpp"

namespace ptrain {

// What is read of an attempt's folder, whose files its ranks write (and
// with --launcher nodes every node): regular files only, links not followed,
// each read bounded (common/bounded_file.h). Bigger dumps are refused
// unread: a ring of 2048 entries is well under 1 MiB, so 64 MiB is damage,
// not a big job.
inline constexpr size_t kMaxDumpBytes = size_t{64} << 20;
// A dump's line: a header names every group's members, so a large world's
// is long; an entry's line is under 1 KiB.
inline constexpr size_t kMaxDumpLineBytes = size_t{16} << 20;
// Of stderr.log only the end is read for mpirun's word on exits.
inline constexpr size_t kMaxStderrTailBytes = size_t{4} << 20;

// A rank is named a culprit for holding the others up ("compute") only once
// a rank has waited for it longer than this, by their dumps: a healthy job's
// ranks wait for each other all the time, for moments. Ranks that died or
// stopped, disagree on a collective or do not answer are culprits whatever
// the wait. Waits this short are not told as cycles or calls in progress
// either.
inline constexpr int64_t kCulpritWaitUs = int64_t{10} * 1000000;

// Without a request to answer (an ended attempt, or one whose ranks could
// not be asked), the newest dumps tell the end: those of one request, or of
// one teardown (SIGTERM), are written within seconds of each other, so a
// dump older than the newest by more than this is from an earlier request
// and says nothing of the end.
inline constexpr int64_t kDumpRoundUs = int64_t{30} * 1000000;

// One line of a dump after the header: a communication call ("comm") or a
// phase mark ("mark").
struct FlightEntry {
  bool mark = false;  // a "mark" line; else "comm"
  uint64_t id = 0;
  // comm: group, op and state; both: phase. op is one of all_reduce,
  // reduce_scatter, all_gather, broadcast, send, recv, barrier; state one of
  // queued, started, completed.
  std::string group, op, phase, state;
  int64_t seq = 0, bytes = 0, peer_seq = 0, step = 0;
  int peer = -1, microbatch = -1;  // peer: a world rank (send/recv), else -1
  // Microseconds since the epoch. end_us 0: not completed. A mark keeps its
  // unix_us in start_us.
  int64_t enqueue_us = 0, start_us = 0, end_us = 0;
};

// One rank's dump: the header and the ring's entries.
struct FlightDump {
  int rank = 0, world_size = 0, pid = 0;
  std::string host, reason, phase;
  std::map<std::string, int> coords;
  // group -> the world ranks of its members, in group order.
  std::map<std::string, std::vector<int>> groups;
  int64_t dumped_unix_us = 0, step = 0, last_activity_unix_us = 0, recorded = 0;
  int microbatch = -1, capacity = 0;
  std::vector<FlightEntry> entries;  // oldest first
};

// Parses one dump file's text (JSON lines, the header first). On any damage
// (not JSON, a missing or ill-typed key, a negative size, an unknown
// op/state/type, a rank outside [0, world_size), the header not first, ids
// not increasing, more entries than the ring holds) InvalidArgument whose
// message starts "line N: " and names the key or the rule broken.
absl::StatusOr<FlightDump> ParseFlightDump(absl::string_view text);

// What is known of an attempt apart from the dumps.
struct AttemptFacts {
  int attempt = 0;
  int world_size = 0;  // 0: take it from the dumps
  // When the dumps were asked for: a dump older than this did not answer
  // (0: the newest dumps count, those within kDumpRoundUs of the newest).
  int64_t requested_unix_us = 0;
  int64_t now_unix_us = 0;  // 0: unknown (no "N s ago" in the text)
  // World rank -> how mpirun saw it end, e.g. "exited on signal 9 (Killed)".
  std::map<int, std::string> exits;
  // World rank -> (node, pid) of the process mpirun saw end, for ranks that
  // left no dump to say so. DiagnoseAttemptDir fills it with `exits`.
  std::map<int, std::pair<std::string, int>> exited_processes;
  // The state of process `pid` on `host` where the caller can see it: "R",
  // "S", "D", "T", "t", "Z", "gone" (no such process) or "" (unknown). May be
  // null. Called at most once per rank, only for ranks the verdict hinges on.
  std::function<std::string(const std::string& host, int pid)> process_state;
  // World rank -> when ptcoord last heard from it (its heartbeats, every
  // heartbeat_every_us); empty when unknown. A rank silent for several
  // heartbeats while the others are heard is stopped (or its node froze),
  // wherever its process is.
  std::map<int, int64_t> heard_unix_us;
  int64_t heartbeat_every_us = 0;
  // World rank -> the newest step it said it completed (its heartbeats,
  // its progress reports) and when: where a rank that did not answer is,
  // when that is newer than its last dump.
  struct Reported {
    int64_t step = 0;
    int64_t unix_us = 0;
  };
  std::map<int, Reported> reported;
  // How the attempt ended ("failed, exit code 1: ...", "succeeded"); "" while
  // it runs. Its dumps then tell its end, not its present: a rank left only
  // its start dump "ended", not "running in setup".
  std::string ended;
};

struct RankVerdict {
  int rank = 0;
  std::string host;  // "" when unknown
  int pid = 0;       // 0 when unknown
  // Culprits: "stopped", "died", "compute", "mismatch", "not_answering".
  // Others: "waiting" (blocked in a call), "running" (dumped, in no call),
  // "ended" (the attempt ended and the rank held nobody up), "unknown" (no
  // usable dump and nothing else known).
  std::string state;
  // One phrase, e.g. "tp all_reduce #1835 in forward of microbatch 3,
  // step 812".
  std::string where;
  // E.g. "state T (stopped: SIGSTOP?)", "exited on signal 9 (Killed)", "has
  // not entered a collective for 61 s".
  std::string detail;
  std::vector<int> waits_for;  // waiting ranks: the ranks they wait for
};

struct Diagnosis {
  int attempt = 0;
  std::vector<int> culprits;       // the ranks everything waits for, ascending
  std::vector<RankVerdict> ranks;  // one per world rank, ascending
  // Files named and skipped: "rank-00003.jsonl: line 4: ...",
  // "rank-00001.jsonl: is a FIFO, not a regular file".
  std::vector<std::string> damaged;
  std::string ended;  // AttemptFacts::ended
  // One sentence a line, the first starting "attempt N: ": one per culprit
  // (culprits alike in state and cause share one, as do the ranks of one
  // mismatch; past 8, one more counts the rest), else one per cycle of
  // ranks waiting for each other, else what the ranks do. Not wrapped.
  std::string summary;

  // One screen: the summary wrapped at 80 columns, then a table RANK NODE
  // PID STATE WHERE (over 32 ranks: the culprits and the ranks waiting on
  // them, the rest counted in one line), then the files skipped, each on a
  // line "skipped: NAME: why".
  std::string Text() const;
  // {"attempt", "ended", "culprits", "summary", "damaged", "ranks": [{"rank",
  // "host", "pid", "state", "where", "detail", "waits_for"}]}.
  nlohmann::json Json() const;
};

// The analysis of parsed dumps, keyed by world rank. A dump whose rank or
// world size disagrees with its key or the attempt is named in `damaged`
// and skipped, as are the `damaged` passed in.
Diagnosis Diagnose(const AttemptFacts& facts,
                   const std::map<int, FlightDump>& dumps,
                   std::vector<std::string> damaged = {});

// <attempt_dir>/flight, opened without following a link there, and the
// names of the dumps in it. Not thread-safe (one reader at a time).
class FlightFolder {
 public:
  // NotFound naming the folder when it is missing or no folder.
  static absl::StatusOr<FlightFolder> Open(const std::string& attempt_dir);
  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }
  // (rank, file name) of each rank-NNNNN.jsonl, by rank.
  const std::vector<std::pair<int, std::string>>& dumps() const {
    return dumps_;
  }
  // File `name` in the folder: a regular file of at most `max_bytes`, else
  // an error led by the name ("rank-00001.jsonl: is a FIFO, not a regular
  // file").
  absl::StatusOr<std::string> Read(const std::string& name,
                                   size_t max_bytes) const;
  // Its first line, at most kMaxDumpLineBytes.
  absl::StatusOr<std::string> FirstLine(const std::string& name) const;

 private:
  FlightFolder(std::string path, UniqueFd fd)
      : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  UniqueFd fd_;
  std::vector<std::pair<int, std::string>> dumps_;
};

// What the first line of each dump says of it: whether it answers a
// request (ptcoord waits for those) without reading the rest.
struct DumpHeader {
  int rank = 0;
  std::string reason;  // "" when the header does not say
  int64_t dumped_unix_us = 0;
};
// One per dump whose first line is a JSON object; unreadable ones are left
// out. Empty when there is no flight folder.
std::vector<DumpHeader> ReadDumpHeaders(const std::string& attempt_dir);

// Reads <attempt_dir>/flight/rank-NNNNN.jsonl (a damaged or unreadable
// file, one that is no regular file, a link, or over kMaxDumpBytes, is named
// in `damaged` and skipped) and, when facts.exits is empty, fills it from
// mpirun's lines in the last kMaxStderrTailBytes of <attempt_dir>/stderr.log
// ("mpirun noticed that process rank 5 with PID 4242 on node b exited on
// signal 9 (Killed).", with or without a "[1,5]<stderr>:" prefix; a log
// that cannot be read is named in `damaged`). NotFound when the folder holds
// no dump at all. Reads files ranks write: call it off any lock.
absl::StatusOr<Diagnosis> DiagnoseAttemptDir(const std::string& attempt_dir,
                                             AttemptFacts facts);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_FLIGHT_ANALYSIS_H_
