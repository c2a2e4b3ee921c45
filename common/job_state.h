// The names of a job's states and of the ways an attempt ends, as ptcoord
// keeps them (metrics labels, events, messages) and ptctl prints and takes
// them, and which states are final. Both sides of the API read these from
// here, so a state added to the proto is named the same everywhere.
#ifndef PTRAIN_COMMON_JOB_STATE_H_
#define PTRAIN_COMMON_JOB_STATE_H_

#include <optional>
#include <string>
#include <vector>

#include "ptrain/v1/coordinator.pb.h"

namespace ptrain {

// SUCCEEDED, FAILED and CANCELLED: a job in one never runs again.
bool IsFinal(v1::JobState s);

// The JobState name without its prefix: "RUNNING", ...
std::string StateName(v1::JobState s);

// StateName in lower case ("running"): how `ptctl list --state` and the
// web UI name a state.
std::string LowerStateName(v1::JobState s);

// LowerStateName of every JobState but UNSPECIFIED: what `ptctl list
// --state` and the web UI's state= take.
std::vector<std::string> LowerStateNames();

// The JobState of a LowerStateNames name; nullopt for any other text.
std::optional<v1::JobState> StateOfLowerName(const std::string& name);

// The AttemptEnd name in lower case without its prefix ("node_lost"): the
// key of Job.requeues and the `reason` of ptrain_job_requeues_total.
std::string EndName(v1::AttemptEnd end);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_JOB_STATE_H_
