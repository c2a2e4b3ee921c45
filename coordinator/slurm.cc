// See slurm.h.
#include "coordinator/slurm.h"

#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// `s` in single quotes for sh, a quote inside written as '\''.
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string FirstLine(const std::string& text) {
  return std::string(absl::StripAsciiWhitespace(
      absl::string_view(text).substr(0, text.find('\n'))));
}

}  // namespace

std::string SlurmJobName(const std::string& job_id, int attempt) {
  return absl::StrCat("ptrain-", job_id, "-", attempt);
}

std::string SlurmBatchScript(const LaunchRequest& r,
                             const std::string& attempt_dir,
                             int cpus_per_task) {
  std::vector<std::string> cmd = {
      "srun",
      "--mpi=pmix",
      "--kill-on-bad-exit=1",
      absl::StrCat("--cpus-per-task=", std::max(1, cpus_per_task)),
      "--cpu-bind=cores",
      "--label",
      r.ptworker,
      "--config",
      (fs::path(r.job_dir) / "spec.yaml").string(),
      "--log-json",
      (fs::path(attempt_dir) / "run.jsonl").string()};
  if (r.resume_flag) {
    cmd.insert(cmd.end(), {"--resume-from", "latest"});
    if (!r.fork_from.empty())
      cmd.insert(cmd.end(), {"--fork-from", r.fork_from});
  }
  std::vector<std::string> quoted;
  for (const std::string& c : cmd) quoted.push_back(ShellQuote(c));
  const std::string dir = ShellQuote(attempt_dir);
  return absl::StrCat(
      "#!/bin/sh\n"
      "# ptrain: attempt ",
      r.attempt, " of ", r.job_id,
      " (written by ptcoord). The ranks' environment comes from sbatch.\n",
      absl::StrJoin(quoted, " "),
      "\n"
      "rc=$?\n",
      RecordExitCode(dir),
      "\n"
      "exit $rc\n");
}

std::vector<std::string> SbatchCommand(const LaunchRequest& r,
                                       const std::string& attempt_dir,
                                       int ranks_per_node, int cpus_per_task,
                                       const SlurmOptions& o) {
  std::vector<std::string> argv = {
      "sbatch", "--parsable",
      absl::StrCat("--job-name=", SlurmJobName(r.job_id, r.attempt)),
      absl::StrCat("--ntasks=", r.world_size),
      absl::StrCat("--cpus-per-task=", std::max(1, cpus_per_task)),
      // ptcoord decides restarts (from the newest checkpoint); Slurm must
      // not rerun the attempt on its own.
      "--no-requeue",
      absl::StrCat("--output=",
                   (fs::path(attempt_dir) / "stdout.log").string()),
      absl::StrCat("--error=", (fs::path(attempt_dir) / "stderr.log").string()),
      absl::StrCat("--chdir=", r.work_dir.empty() ? attempt_dir : r.work_dir),
      "--export=ALL"};
  if (ranks_per_node > 0) {
    // As few nodes as the ranks fit on, each with at most ranks_per_node.
    const int nodes = (r.world_size + ranks_per_node - 1) / ranks_per_node;
    argv.push_back(absl::StrCat("--nodes=", nodes));
    argv.push_back(absl::StrCat("--ntasks-per-node=", ranks_per_node));
  }
  if (!o.partition.empty()) {
    argv.push_back(absl::StrCat("--partition=", o.partition));
  }
  if (!o.account.empty()) argv.push_back(absl::StrCat("--account=", o.account));
  argv.insert(argv.end(), o.extra.begin(), o.extra.end());
  argv.push_back((fs::path(attempt_dir) / "slurm.sh").string());
  return argv;
}

std::optional<SlurmJob> ParseScontrolJob(const std::string& text) {
  SlurmJob job;
  bool any = false;
  for (absl::string_view field :
       absl::StrSplit(text, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    const size_t eq = field.find('=');
    if (eq == absl::string_view::npos) continue;
    const absl::string_view key = field.substr(0, eq);
    const absl::string_view value = field.substr(eq + 1);
    if (key == "JobState") {
      job.state = std::string(value);
      any = true;
    } else if (key == "Reason") {
      job.reason = std::string(value);
    } else if (key == "NodeList") {
      job.nodes = std::string(value);
    } else if (key == "ExitCode") {
      const std::pair<absl::string_view, absl::string_view> parts =
          absl::StrSplit(value, ':');
      if (!absl::SimpleAtoi(parts.first, &job.exit_code)) job.exit_code = 0;
      if (!absl::SimpleAtoi(parts.second, &job.signal)) job.signal = 0;
    }
  }
  if (!any) return std::nullopt;
  return job;
}

bool SlurmJobEnded(const std::string& state) {
  return !(state == "PENDING" || state == "CONFIGURING" || state == "RUNNING" ||
           state == "COMPLETING" || state == "SUSPENDED" ||
           state == "REQUEUED" || state == "RESIZING" || state == "SIGNALING" ||
           state == "STAGE_OUT" || state == "STOPPED");
}

absl::StatusOr<std::string> SubmitSlurmAttempt(const LaunchRequest& r,
                                               int ranks_per_node,
                                               int cpus_per_task,
                                               const SlurmOptions& o) {
  absl::StatusOr<std::string> dir = MakeAttemptDir(r);
  if (!dir.ok()) return dir.status();
  const std::string script = (fs::path(*dir) / "slurm.sh").string();
  if (absl::Status s =
          ReplacePrivateFile(script, SlurmBatchScript(r, *dir, cpus_per_task));
      !s.ok()) {
    return s;
  }
  fs::permissions(script, fs::perms::owner_all);
  LaunchRequest with_threads = r;
  with_threads.threads = std::max(1, cpus_per_task);
  absl::StatusOr<CommandResult> run =
      RunCommand(SbatchCommand(r, *dir, ranks_per_node, cpus_per_task, o),
                 AttemptEnvironment(with_threads));
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat("sbatch exited with code ", run->exit_code, ": ",
                     FirstLine(run->err.empty() ? run->out : run->err)));
  }
  // --parsable: "ID" or "ID;CLUSTER".
  const std::string line = FirstLine(run->out);
  const std::string id = line.substr(0, line.find(';'));
  int64_t n = 0;
  if (!absl::SimpleAtoi(id, &n)) {
    return absl::UnavailableError(
        absl::StrCat("sbatch printed no job id: ", FirstLine(run->out)));
  }
  return absl::StrCat(n);
}

absl::StatusOr<SlurmJob> QuerySlurmJob(const std::string& id) {
  absl::StatusOr<CommandResult> run =
      RunCommand({"scontrol", "show", "job", "-o", id}, CurrentEnvironment());
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    if (absl::StrContains(run->err, "Invalid job id")) {
      return absl::NotFoundError(absl::StrCat("Slurm job ", id, " is gone"));
    }
    return absl::UnavailableError(
        absl::StrCat("scontrol: ", FirstLine(run->err)));
  }
  std::optional<SlurmJob> job = ParseScontrolJob(run->out);
  if (!job.has_value()) {
    return absl::UnavailableError(
        absl::StrCat("scontrol: no JobState in: ", FirstLine(run->out)));
  }
  return *job;
}

absl::StatusOr<std::string> FindSlurmJob(const std::string& name) {
  absl::StatusOr<CommandResult> run = RunCommand(
      {"squeue", "-h", "--name", name, "-o", "%i"}, CurrentEnvironment());
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat("squeue: ", FirstLine(run->err)));
  }
  std::string newest;
  for (absl::string_view line :
       absl::StrSplit(run->out, '\n', absl::SkipWhitespace())) {
    newest = std::string(absl::StripAsciiWhitespace(line));
  }
  return newest;
}

int SlurmTaskCapacity(const std::vector<int>& node_cpus, int cpus_per_task,
                      int per_node) {
  int tasks = 0;
  for (int c : node_cpus) {
    const int n = c / std::max(1, cpus_per_task);
    tasks += per_node > 0 ? std::min(n, per_node) : n;
  }
  return tasks;
}

std::vector<SlurmNode> ParseSinfoNodes(const std::string& out) {
  std::vector<SlurmNode> nodes;
  for (absl::string_view line :
       absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
    const std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    SlurmNode n;
    if (f.size() < 3 || !absl::SimpleAtoi(f[2], &n.cpus)) continue;
    n.name = std::string(f[0]);
    n.state = std::string(f[1]);
    nodes.push_back(std::move(n));
  }
  return nodes;
}

bool SlurmNodeUsable(const std::string& state) {
  // idle, mix, alloc, comp(leting) are up; a trailing '*' means not
  // responding, down/drain/fail/maint are not usable.
  return state == "idle" || state == "mix" || state == "alloc" ||
         state == "comp" || state == "mixed" || state == "allocated";
}

bool SlurmNodeLost(const std::string& state) {
  return absl::EndsWith(state, "*") || absl::StartsWith(state, "down") ||
         absl::StartsWith(state, "fail");
}

namespace {

absl::StatusOr<std::vector<SlurmNode>> Sinfo(std::vector<std::string> args) {
  std::vector<std::string> argv = {"sinfo", "-h", "-N", "-o", "%N %t %c"};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<CommandResult> run = RunCommand(argv, CurrentEnvironment());
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("sinfo: ", FirstLine(run->err)));
  }
  return ParseSinfoNodes(run->out);
}

}  // namespace

absl::StatusOr<std::vector<int>> SlurmUpNodeCpus(const std::string& partition) {
  std::vector<std::string> args;
  if (!partition.empty()) args = {"-p", partition};
  absl::StatusOr<std::vector<SlurmNode>> nodes = Sinfo(args);
  if (!nodes.ok()) return nodes.status();
  // A node in two partitions is listed twice: count it once.
  std::map<std::string, int> cpus;
  for (const SlurmNode& n : *nodes) {
    if (SlurmNodeUsable(n.state)) cpus[n.name] = n.cpus;
  }
  std::vector<int> out;
  for (const auto& [node, n] : cpus) out.push_back(n);
  return out;
}

absl::StatusOr<std::vector<std::string>> SlurmLostNodes(
    const std::string& nodelist) {
  if (nodelist.empty() || nodelist == "(null)") {
    return std::vector<std::string>();
  }
  absl::StatusOr<std::vector<SlurmNode>> nodes = Sinfo({"-n", nodelist});
  if (!nodes.ok()) return nodes.status();
  std::set<std::string> lost;
  for (const SlurmNode& n : *nodes) {
    if (SlurmNodeLost(n.state)) lost.insert(n.name);
  }
  return std::vector<std::string>(lost.begin(), lost.end());
}

absl::Status CancelSlurmJob(const std::string& id, const std::string& signal,
                            bool batch_too) {
  std::vector<std::string> argv = {"scancel"};
  if (batch_too && !signal.empty()) argv.push_back("--full");
  if (!signal.empty()) argv.push_back(absl::StrCat("--signal=", signal));
  argv.push_back(id);
  absl::StatusOr<CommandResult> run = RunCommand(argv, CurrentEnvironment());
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    return absl::UnavailableError(
        absl::StrCat("scancel: ", FirstLine(run->err)));
  }
  return absl::OkStatus();
}

}  // namespace ptrain
