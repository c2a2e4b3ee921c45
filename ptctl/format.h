// How ptctl shows jobs, attempts and nodes: figures, times, state words,
// the job table and JSON. Plain functions of the messages; printing the
// table is the only output.
#ifndef PTRAIN_PTCTL_FORMAT_H_
#define PTRAIN_PTCTL_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ptrain/v1/coordinator.pb.h"

namespace ptrain::ptctl {

// How an ended attempt ended, in words ("paused", "node lost"): a pause
// or a cancel ends an attempt with a non-zero exit code that is no failure.
std::string EndWords(const v1::Attempt& a);

// A figure, or "—" for one never measured, which is not a 0.
std::string Figure(bool measured, double value, int decimals = 4);

// The figures a job reports with its steps exist once it trained one.
bool HasSteps(const v1::Progress& p);

// `text` right-aligned in `width` columns ("—" is one column, three bytes).
std::string PadLeft(const std::string& text, size_t width);

// What a job not yet ended is on its way to while its attempt ends:
// "cancelling", "pausing", or "".
std::string Ending(const v1::Job& job);

// Why a job's figures may not be its last ones, or "": reports ptcoord
// could not save (a full state disk), or a succeeded job whose newest
// saved step is short of train.steps.
std::string FiguresNote(const v1::Job& job);

// How long ago `unix_ms` was: "42s", "7m", "3h"; "-" for 0 (never).
std::string Ago(int64_t unix_ms);

// `seconds` as M:SS or H:MM:SS; "--:--" when unknown.
std::string Duration(double seconds);

// Prints `jobs` as a table on stdout, a line a job.
void PrintJobsTable(const std::vector<v1::Job>& jobs);

// Prints the waiting `jobs` (ListQueue) in the order they would start: place,
// id, owner, priority, slots, and why each waits.
void PrintQueueTable(const std::vector<v1::Job>& jobs);

// "UP", "DOWN", or "?".
const char* NodeStateName(v1::NodeState s);

}  // namespace ptrain::ptctl

#endif  // PTRAIN_PTCTL_FORMAT_H_
