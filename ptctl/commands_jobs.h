// ptctl's job commands: submit, get, list, cancel, pause, resume, logs,
// checkpoints, diagnose. Each calls ptcoord once (logs: a stream), prints the
// answer (a table or, with -o json, JSON) and returns ptctl's exit code.
#ifndef PTRAIN_PTCTL_COMMANDS_JOBS_H_
#define PTRAIN_PTCTL_COMMANDS_JOBS_H_

#include <string>
#include <vector>

#include "ptctl/connection.h"

namespace ptrain::ptctl {

// Checks spec `file` with `sets` applied as ptcoord would, then submits it;
// prints the job id, and with `watch` follows the job (Watch). With
// `dry_run`, submits nothing and prints what ptcoord says the job would be
// (SubmitJobRequest.dry_run).
// `from`: "JOB[@STEP]", start from that job's checkpoint
// (SubmitJobRequest.from_job); "" for none.
int Submit(Client& client, const std::string& file,
           const std::vector<std::string>& sets, bool watch, bool dry_run,
           const std::string& from);

// Shows job `id`: its state, progress, placement and attempts.
int Get(Client& client, const std::string& id);

// Lists jobs. `limit`: the newest N (0: all); `state`: a JobState name without
// its prefix, any case ("" = every state); `owner`: only that user's ("" =
// everyone's); `mine`: only the caller's.
int List(Client& client, int limit, const std::string& state,
         const std::string& owner = "", bool mine = false);

// `whoami`: the caller's user name, role and quota.
int WhoAmI(Client& client);

// `priority JOB P`: sets job `id`'s priority (low, normal, high, 0..1000).
int Priority(Client& client, const std::string& id,
             const std::string& priority);

// `queue`: the waiting jobs in the order they would start, each with why it
// waits.
int Queue(Client& client);

// Cancels job `id` (idempotent); prints "ID STATE".
int Cancel(Client& client, const std::string& id);

// `pause` (running: save, stop and wait for `resume`) or `resume`.
int PauseOrResume(Client& client, const std::string& id, bool pause);

// Runs the SUCCEEDED job `id` on to `steps` (JobService.ExtendJob).
int Extend(Client& client, const std::string& id, int64_t steps);
// `events`: what happened to a job, oldest first, a line each.
int Events(Client& client, const std::string& id);
// `delete`: forgets an ended job; its checkpoints too with `purge`.
int Delete(Client& client, const std::string& id, bool purge);

// Prints attempt `attempt` (0: the latest) of job `id`; with `follow`, until
// it ends. `rank` < 0: every line; else only that rank's (whole lines, so
// each stream keeps its unfinished last line until the rest arrives).
int Logs(Client& client, const std::string& id, bool follow, int attempt,
         int rank);

// Lists job `id`'s checkpoints: step, attempt, folder.
int Checkpoints(Client& client, const std::string& id);

// Says which ranks of attempt `attempt` (0: the running one, else the
// newest that dumped) are behind and where the others wait for them, from
// their flight recorder dumps (docs/diagnose.md); -o json: the analysis as
// JSON. Exit 1 when no attempt has dumps (ptcoord says why).
int Diagnose(Client& client, const std::string& id, int attempt);

}  // namespace ptrain::ptctl

#endif  // PTRAIN_PTCTL_COMMANDS_JOBS_H_
