// Process management for job attempts; see launcher.h. Linux only (/proc).
// Children are started by Spawn (common/spawn.h).
#include "coordinator/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/bounded_file.h"
#include "common/digest.h"
#include "common/process.h"
#include "common/spawn.h"
#include "common/spec.h"

extern char** environ;

namespace ptrain {
namespace {

namespace fs = std::filesystem;

// What exit_code holds until the attempt's wrapper overwrites it: as long
// as any code the wrapper writes (RecordExitCode), so the overwrite takes
// the file's own blocks.
constexpr absl::string_view kExitPending = "running        \n";
static_assert(kExitPending.size() == 16);

// $0 of the wrapper: its command line then names the attempt folder, which is
// how a re-adopting ptcoord recognises it.
std::string Wrapper() {
  return absl::StrCat("\"$@\"; rc=$?; ", RecordExitCode("\"$0\""),
                      "; exit $rc");
}

}  // namespace

std::string Hostfile(const std::vector<NodeRanks>& placement) {
  std::string out;
  for (const NodeRanks& n : placement) {
    absl::StrAppend(&out, n.name, " slots=", n.ranks, " max_slots=", n.ranks,
                    "\n");
  }
  return out;
}

absl::StatusOr<std::string> PrepareJobDir(
    const std::string& state_dir, const std::string& job_id,
    const v1::JobSpec& spec, int world_size, const std::string& tls_ca_pem,
    const std::vector<NodeRanks>& placement) {
  const fs::path dir = fs::path(state_dir) / "jobs" / job_id;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) fs::permissions(dir.parent_path(), fs::perms::owner_all, ec);
  if (!ec) fs::permissions(dir, fs::perms::owner_all, ec);
  if (ec)
    return absl::UnavailableError(
        absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  absl::Status s =
      ReplacePrivateFile((dir / "spec.yaml").string(), JobSpecToYaml(spec));
  if (!s.ok()) return s;
  s = ReplacePrivateFile(
      (dir / "hostfile").string(),
      placement.empty() ? absl::StrCat("localhost slots=", world_size, "\n")
                        : Hostfile(placement));
  if (!s.ok()) return s;
  if (!tls_ca_pem.empty()) {
    s = ReplacePrivateFile((dir / "tls-ca.pem").string(), tls_ca_pem);
    if (!s.ok()) return s;
  }
  return dir.string();
}

std::string Rankfile(const LaunchRequest& r) {
  // Each rank's host: this one, or its node's name as the hostfile says.
  std::vector<std::string> hosts;
  for (const NodeRanks& n : r.placement)
    hosts.insert(hosts.end(), n.ranks, n.name);
  std::string out;
  for (size_t rank = 0; rank < r.rank_cpus.size(); ++rank) {
    absl::StrAppend(&out, "rank ", rank, "=",
                    rank < hosts.size() ? hosts[rank] : "localhost",
                    " slot=", absl::StrJoin(r.rank_cpus[rank], ","), "\n");
  }
  return out;
}

std::vector<std::string> AttemptCommand(const LaunchRequest& r,
                                        const std::string& attempt_dir) {
  std::vector<std::string> argv = {
      "/bin/sh",         "-c",     Wrapper(),
      attempt_dir,       r.mpirun, "--allow-run-as-root",
      "--oversubscribe", "--mca",  "btl",
      "self,vader,tcp"};
  if (!r.placement.empty()) {
    // docs/multinode.md: mpirun alone starts an orted on every node through
    // ptrsh (no tree spawn: a daemon takes launches only from the holder of
    // the attempt's token), each orted stays attached to its Exec stream
    // (so a node daemon's death ends the attempt), and TCP keepalive probes
    // find a vanished node in about 10 s instead of the kernel's minutes.
    const std::vector<std::pair<std::string, std::string>> mca = {
        {"plm_rsh_agent", r.rsh_agent},       {"plm_rsh_no_tree_spawn", "1"},
        {"orte_leave_session_attached", "1"}, {"oob_tcp_keepalive_time", "5"},
        {"oob_tcp_keepalive_intvl", "2"},     {"oob_tcp_keepalive_probes", "3"},
    };
    for (const auto& [k, v] : mca) {
      argv.insert(argv.end(), {"--mca", k, v});
    }
    if (!r.cluster_network.empty()) {
      argv.insert(argv.end(),
                  {"--mca", "oob_tcp_if_include", r.cluster_network, "--mca",
                   "btl_tcp_if_include", r.cluster_network});
    }
    argv.insert(argv.end(),
                {"--hostfile", (fs::path(r.job_dir) / "hostfile").string()});
  }
  // Each rank on the CPUs of its slots, where ptcoord bound them; else no
  // binding at all: mpirun's own (a rank or two to core 0, the next job's
  // too) would crowd every job's threads onto the same cores.
  if (!r.rank_cpus.empty()) {
    argv.insert(argv.end(),
                {"--mca", "rmaps_rank_file_physical", "1", "--rankfile",
                 (fs::path(attempt_dir) / "rankfile").string()});
  } else {
    argv.insert(argv.end(), {"--bind-to", "none"});
  }
  // Every line in the attempt's logs says which rank wrote it
  // ("[1,RANK]<stderr>:"), wherever the rank ran: ptctl logs --rank.
  argv.push_back("--tag-output");
  const std::vector<std::string> tail = {
      "-n",
      absl::StrCat(r.world_size),
      "-x",
      "PTRAIN_COORDINATOR",
      "-x",
      "PTRAIN_JOB_ID",
      "-x",
      "PTRAIN_JOB_UID",
      "-x",
      "PTRAIN_JOB_TOKEN",
      "-x",
      "PTRAIN_ATTEMPT",
      "-x",
      "PTRAIN_ATTEMPT_UID",
      "-x",
      "PTRAIN_DATA_ROOTS",
      "-x",
      "PTRAIN_TLS_CA",
      "-x",
      "OMP_NUM_THREADS",
      "-x",
      "PTRAIN_METRICS_BIND",
      "-x",
      "PTRAIN_RANK_GPUS",
      "-x",
      "PTRAIN_COORDINATOR_GRACE_S",
      r.ptworker,
      "--config",
      (fs::path(r.job_dir) / "spec.yaml").string(),
      "--log-json",
      (fs::path(attempt_dir) / "run.jsonl").string()};
  argv.insert(argv.end(), tail.begin(), tail.end());
  if (r.resume_flag) {
    argv.push_back("--resume-from");
    argv.push_back("latest");
    if (!r.fork_from.empty())
      argv.insert(argv.end(), {"--fork-from", r.fork_from});
  }
  return argv;
}

std::string AttemptDirOf(const LaunchRequest& r) {
  return (fs::path(r.job_dir) / absl::StrCat("attempt-", r.attempt)).string();
}

absl::StatusOr<std::string> MakeAttemptDir(const LaunchRequest& r) {
  const std::string attempt_dir = AttemptDirOf(r);
  std::error_code ec;
  fs::create_directories(attempt_dir, ec);
  if (!ec) fs::permissions(attempt_dir, fs::perms::owner_all, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", attempt_dir, ": ", ec.message()));
  }
  // Written and synced now, while there is room: the wrapper's code later
  // overwrites these bytes and needs no new space, so it reaches the disk
  // even when the disk has filled up meanwhile.
  const std::string exit_file = (fs::path(attempt_dir) / "exit_code").string();
  if (absl::Status s = ReplacePrivateFile(exit_file, std::string(kExitPending));
      !s.ok()) {
    return s;
  }
  return attempt_dir;
}

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, eq - *e)] = eq + 1;
  }
  return env;
}

std::map<std::string, std::string> AttemptEnvironment(const LaunchRequest& r) {
  // Ours, with the job's variables replaced.
  std::map<std::string, std::string> env = CurrentEnvironment();
  env["PTRAIN_COORDINATOR"] = r.coordinator_address;
  env["PTRAIN_JOB_ID"] = r.job_id;
  env["PTRAIN_JOB_UID"] = r.job_uid;
  env["PTRAIN_JOB_TOKEN"] = r.token;
  env["PTRAIN_ATTEMPT"] = absl::StrCat(r.attempt);
  env["PTRAIN_ATTEMPT_UID"] = r.attempt_uid;
  env["PTRAIN_DATA_ROOTS"] = absl::StrJoin(r.data_roots, ":");
  // Set (possibly empty) either way, so `-x` forwards it and nothing from
  // ptcoord's own environment leaks through.
  env["PTRAIN_TLS_CA"] = r.tls_ca_file;
  int threads = r.threads;
  // Bound: every rank as many threads as the fewest CPUs a rank has (one
  // variable for all ranks; nodes may cut their slots differently).
  if (threads <= 0) {
    for (const std::vector<int>& cpus : r.rank_cpus) {
      const int n = static_cast<int>(cpus.size());
      threads = threads <= 0 ? n : std::min(threads, n);
    }
  }
  if (threads <= 0) threads = std::max(1, r.cores / std::max(1, r.world_size));
  env["OMP_NUM_THREADS"] = absl::StrCat(threads);
  if (!r.placement.empty()) env["PTRAIN_NODES_FILE"] = r.nodes_file;
  env["OMPI_MCA_mpi_yield_when_idle"] = "1";
  env["PTRAIN_METRICS_BIND"] = r.rank_metrics_bind;
  // Set (possibly empty) either way, as PTRAIN_TLS_CA.
  env["PTRAIN_RANK_GPUS"] = absl::StrJoin(r.rank_gpus, ",");
  env["PTRAIN_COORDINATOR_GRACE_S"] = absl::StrCat(r.coordinator_grace_s);
  return env;
}

absl::StatusOr<Launched> LaunchAttempt(const LaunchRequest& r) {
  absl::StatusOr<std::string> dir = MakeAttemptDir(r);
  if (!dir.ok()) return dir.status();
  const std::string attempt_dir = *dir;
  if (!r.rank_cpus.empty()) {
    if (absl::Status s = ReplacePrivateFile(
            (fs::path(attempt_dir) / "rankfile").string(), Rankfile(r));
        !s.ok()) {
      return s;
    }
  }
  SpawnOptions o;
  o.argv = AttemptCommand(r, attempt_dir);
  o.env = AttemptEnvironment(r);
  o.stdout_path = (fs::path(attempt_dir) / "stdout.log").string();
  o.stderr_path = (fs::path(attempt_dir) / "stderr.log").string();
  o.work_dir = r.work_dir.empty() ? attempt_dir : r.work_dir;
  o.own_process_group = true;
  // Descriptors marked close-on-exec stay open until the exec: among them
  // the state dir's lock, so that a coordinator restarting meanwhile
  // waits for it and then finds this attempt by its environment.
  o.fds = SpawnOptions::Fds::kCloseInheritable;
  absl::StatusOr<pid_t> pid = Spawn(o);
  if (!pid.ok()) return pid.status();
  return Launched{*pid, attempt_dir};
}

absl::StatusOr<CommandResult> RunCommand(
    const std::vector<std::string>& argv,
    const std::map<std::string, std::string>& env, const std::string& dir) {
  absl::StatusOr<Pipe> out = Pipe::Open();
  if (!out.ok()) return out.status();
  absl::StatusOr<Pipe> err = Pipe::Open();
  if (!err.ok()) return err.status();
  SpawnOptions o;
  o.argv = argv;
  o.search_path = true;
  o.env = env;
  o.stdout_fd = out->write_fd();
  o.stderr_fd = err->write_fd();
  o.work_dir = dir;
  absl::StatusOr<pid_t> pid = Spawn(o);
  if (!pid.ok()) return pid.status();
  out->CloseWrite();
  err->CloseWrite();
  CommandResult result;
  // Both pipes to their ends (the outputs are small: a job id, a state).
  std::string* sinks[2] = {&result.out, &result.err};
  Pipe* pipes[2] = {&*out, &*err};
  pollfd fds[2] = {{out->read_fd(), POLLIN, 0}, {err->read_fd(), POLLIN, 0}};
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        if (sinks[i]->size() < (1 << 20)) sinks[i]->append(buf, n);
      } else {
        pipes[i]->CloseRead();
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = ExitCodeOf(status);
  return result;
}

std::vector<pid_t> AttemptProcesses(const AttemptKey& key) {
  if (!key.attempt_uid.empty()) {
    return ProcessesWithEnv(
        {absl::StrCat("PTRAIN_ATTEMPT_UID=", key.attempt_uid)});
  }
  if (key.token_sha256.empty()) return {};
  constexpr absl::string_view kToken = "PTRAIN_JOB_TOKEN=";
  return ScanProcesses([&](const std::vector<absl::string_view>& env) {
    for (absl::string_view v : env) {
      if (absl::StartsWith(v, kToken) &&
          Sha256Hex(v.substr(kToken.size())) == key.token_sha256) {
        return true;
      }
    }
    return false;
  });
}

pid_t AttemptLeader(const AttemptKey& key, const std::string& attempt_dir) {
  for (pid_t pid : AttemptProcesses(key)) {
    const std::string cmdline =
        ReadWholeFile("/proc/" + std::to_string(pid) + "/cmdline");
    for (absl::string_view arg : absl::StrSplit(cmdline, '\0')) {
      if (arg == attempt_dir) return pid;
    }
  }
  return 0;
}

void SignalAttempt(pid_t pgid, const AttemptKey& key, int sig) {
  if (pgid > 0) kill(-pgid, sig);
  for (pid_t p : AttemptProcesses(key)) kill(p, sig);
}

bool SignalLauncher(const AttemptKey& key, int sig) {
  bool sent = false;
  for (pid_t p : AttemptProcesses(key)) {
    const std::string comm = std::string(absl::StripTrailingAsciiWhitespace(
        ReadWholeFile("/proc/" + std::to_string(p) + "/comm")));
    if (comm == "mpirun" || comm == "orterun" || comm == "mpiexec" ||
        comm == "prterun") {
      sent = kill(p, sig) == 0 || sent;
    }
  }
  return sent;
}

std::optional<int> ReapChild(pid_t pid) {
  int status = 0;
  const pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  if (r < 0) return -1;  // not our child any more (already reaped)
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

bool AttemptAlive(pid_t pid, const std::string& attempt_dir) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  if (IsZombie(pid)) return false;  // a zombie nobody reaped has ended
  const std::string cmdline =
      ReadWholeFile("/proc/" + std::to_string(pid) + "/cmdline");
  for (absl::string_view arg : absl::StrSplit(cmdline, '\0')) {
    if (arg == attempt_dir) return true;
  }
  return false;
}

std::string RecordExitCode(absl::string_view quoted_dir) {
  // printf pads the code to the pending text's 15 characters; 1<> opens
  // the file for writing without truncating it.
  return absl::StrCat("umask 077; printf '%-15d\\n' \"$rc\" 1<>", quoted_dir,
                      "/exit_code");
}

AttemptExit ReadAttemptExit(const std::string& attempt_dir) {
  AttemptExit out;
  // The file lies in the ranks' folder: a FIFO or a link put there is
  // unknown, as an unreadable file is.
  absl::StatusOr<BoundedFile> f = BoundedFile::Open(
      "", (fs::path(attempt_dir) / "exit_code").string(), Symlinks::kRefuse);
  if (!f.ok()) return out;
  absl::StatusOr<std::string> bytes = f->ReadAt(0, 64);
  if (!bytes.ok() || bytes->empty()) return out;
  const absl::string_view text = *bytes;
  if (text == kExitPending) {
    out.kind = AttemptExit::kPending;
    return out;
  }
  int code = 0;
  if (absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &code) && code >= 0 &&
      code <= 255) {
    out.kind = AttemptExit::kCode;
    out.code = code;
  }
  return out;
}

std::optional<int> ReadExitCode(const std::string& attempt_dir) {
  const AttemptExit e = ReadAttemptExit(attempt_dir);
  if (e.kind != AttemptExit::kCode) return std::nullopt;
  return e.code;
}

std::string TailLines(const std::string& path, int n) {
  absl::StatusOr<FileTail> tail =
      ReadFileTail("", path, 0, kMaxTailBytes, Symlinks::kRefuse);
  if (!tail.ok()) {
    // Said, not hidden: a FIFO or a link there is no log.
    if (absl::IsNotFound(tail.status())) return "";
    return absl::StrCat("(", tail.status().message(), ")\n");
  }
  absl::string_view text = tail->bytes;
  // A window that starts mid-line: that line is cut.
  if (tail->start > 0) {
    const size_t nl = text.find('\n');
    text.remove_prefix(nl == absl::string_view::npos ? text.size() : nl + 1);
  }
  absl::ConsumeSuffix(&text, "\n");
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  if (text.empty()) lines.clear();
  if (lines.size() > static_cast<size_t>(std::max(n, 0))) {
    lines.erase(lines.begin(), lines.end() - std::max(n, 0));
  }
  std::string out;
  for (absl::string_view l : lines) {
    // A line longer than an error message holds is cut.
    if (l.size() > kMaxTailLineBytes) {
      absl::StrAppend(&out, l.substr(0, kMaxTailLineBytes), "…\n");
    } else {
      absl::StrAppend(&out, l, "\n");
    }
  }
  return out;
}

}  // namespace ptrain
