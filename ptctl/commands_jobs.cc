// See commands_jobs.h.
#include "ptctl/commands_jobs.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/exit_codes.h"
#include "common/job_state.h"
#include "common/mesh.h"
#include "common/planned_layout.h"
#include "common/proto_json.h"
#include "common/spec.h"
#include "ptctl/format.h"
#include "ptctl/watch.h"

namespace ptrain::ptctl {

namespace {

// "ID STATE", or what the job is on its way to while the attempt ends.
void PrintJobState(Client& client, const v1::Job& job) {
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(job, true).c_str());
    return;
  }
  const std::string ending = Ending(job);
  std::printf("%s %s\n", job.id().c_str(),
              ending.empty() ? StateName(job.state()).c_str() : ending.c_str());
}

// True when `line` is tagged as written by `rank`: mpirun --tag-output's
// "[JOB,RANK]<stream>:" prefix, or srun --label's "RANK: ".
bool LineOfRank(absl::string_view line, int rank) {
  if (!line.empty() && line[0] != '[') {
    const absl::string_view label =
        absl::StripLeadingAsciiWhitespace(line.substr(0, line.find(": ")));
    int r = -1;
    return line.find(": ") != absl::string_view::npos &&
           absl::SimpleAtoi(label, &r) && r == rank;
  }
  if (line.empty() || line[0] != '[') return false;
  const size_t comma = line.find(',');
  const size_t close = line.find(']');
  if (comma == absl::string_view::npos || close == absl::string_view::npos ||
      comma > close) {
    return false;
  }
  int r = -1;
  return absl::SimpleAtoi(line.substr(comma + 1, close - comma - 1), &r) &&
         r == rank;
}

}  // namespace

namespace {

// "node1 (2; GPUs 0,1), node2 (2; CPUs 0,1)": each node, its ranks, and
// the GPUs and CPUs they hold.
std::string PlacementWords(
    const google::protobuf::RepeatedPtrField<v1::Placement>& placement) {
  std::vector<std::string> where;
  for (const auto& n : placement) {
    where.push_back(absl::StrCat(
        n.node(), " (", n.ranks(),
        n.gpus().empty()
            ? ""
            : absl::StrCat("; GPUs ", absl::StrJoin(n.gpus(), ",")),
        n.cpus().empty()
            ? ""
            : absl::StrCat("; CPUs ", absl::StrJoin(n.cpus(), ",")),
        ")"));
  }
  return absl::StrJoin(where, ", ");
}

// A job's step as its ranks ran it: the median over its training points
// but the first tenth (warm-up), from the global tokens a second each
// reports.
struct MeasuredStep {
  double seconds = 0;
  int steps = 0;
};
std::optional<MeasuredStep> MeasureStep(Client& client, const v1::Job& job) {
  v1::GetJobRequest req;
  req.set_job_id(job.id());
  req.set_include_loss_history(true);
  v1::GetJobResponse resp;
  auto ctx = client.Context();
  if (!client.stub().GetJob(ctx.get(), req, &resp).ok()) return std::nullopt;
  std::vector<double> speeds;
  for (const v1::LossPoint& point : resp.loss_history()) {
    if (point.tok_per_s() > 0) speeds.push_back(point.tok_per_s());
  }
  if (speeds.size() > 1) {
    speeds.erase(speeds.begin(),
                 speeds.begin() + std::max<size_t>(1, speeds.size() / 10));
  }
  if (speeds.empty()) return std::nullopt;
  std::sort(speeds.begin(), speeds.end());
  const double median = speeds[speeds.size() / 2];
  const double tokens = static_cast<double>(job.spec().train().global_batch()) *
                        job.spec().model().block_size();
  return MeasuredStep{tokens / median, static_cast<int>(speeds.size())};
}

// A dry run's answer: the planner's layout (parallel: auto), ptworker's
// report, then where the job would start or why it would wait.
void PrintDryRun(const v1::DryRun& d) {
  if (d.has_plan()) {
    std::printf("# parallel: auto: %s\n", PlannedLayoutWords(d.plan()).c_str());
  }
  std::printf("%s", d.report().c_str());
  if (!d.waits().empty()) {
    std::printf("# submitted now, it would wait: %s\n", d.waits().c_str());
  } else if (d.placement_size() > 0) {
    std::printf("# submitted now, its %d ranks would start at once on %s\n",
                d.world_size(), PlacementWords(d.placement()).c_str());
  } else {
    std::printf(
        "# submitted now, its %d ranks would start at once (the launcher "
        "places them)\n",
        d.world_size());
  }
  std::printf("# nothing was submitted\n");
}

}  // namespace

int Submit(Client& client, const std::string& file,
           const std::vector<std::string>& sets, bool watch, bool dry_run,
           const std::string& from) {
  // --from JOB[@STEP]: checked before anything is read or sent.
  std::string from_job = from;
  int64_t from_step = 0;
  if (const size_t at = from.find('@'); at != std::string::npos) {
    from_job = from.substr(0, at);
    if (!absl::SimpleAtoi(from.substr(at + 1), &from_step) || from_step < 1) {
      std::fprintf(stderr,
                   "ptctl: error: --from %s: STEP after '@' must be a "
                   "positive integer (JOB or JOB@STEP)\n",
                   from.c_str());
      return kExitBadInput;
    }
  }
  if (!from.empty() && from_job.empty()) {
    std::fprintf(stderr,
                 "ptctl: error: --from %s: names no job (JOB or JOB@STEP)\n",
                 from.c_str());
    return kExitBadInput;
  }
  // The same bounded reader and parser as ptworker's: a huge file or
  // /dev/zero is refused here, before anything reaches the coordinator.
  absl::StatusOr<std::string> text = ReadJobSpecFile(file);
  if (!text.ok()) {
    std::fprintf(stderr, "ptctl: error: %s\n",
                 std::string(text.status().message()).c_str());
    return kExitBadInput;
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpec(*text, sets, file);
  if (!spec.ok()) {
    std::fprintf(stderr, "ptctl: error: %s\n",
                 std::string(spec.status().message()).c_str());
    return kExitBadInput;
  }
  for (const std::string& w : JobSpecWarnings(*spec)) {
    std::fprintf(stderr, "ptctl: warning: %s\n", w.c_str());
  }
  v1::SubmitJobRequest req;
  req.set_spec_yaml(*text);
  for (const std::string& s : sets) req.add_overrides(s);
  req.set_dry_run(dry_run);
  req.set_from_job(from_job);
  req.set_from_step(from_step);
  v1::SubmitJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().SubmitJob(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (dry_run) {
    if (client.options().output == "json") {
      std::printf("%s\n", ProtoJson(resp.dry_run(), true).c_str());
    } else {
      PrintDryRun(resp.dry_run());
    }
    return 0;
  }
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp.job(), true).c_str());
  } else {
    std::printf("%s\n", resp.job().id().c_str());
  }
  std::fflush(stdout);
  return watch ? Watch(client, resp.job().id()) : 0;
}

int Get(Client& client, const std::string& id) {
  v1::GetJobRequest req;
  req.set_job_id(id);
  req.set_include_loss_history(client.options().output == "json");
  v1::GetJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().GetJob(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
    return 0;
  }
  const auto& j = resp.job();
  const auto& p = j.progress();
  const std::string ending = Ending(j);
  std::printf(
      "id:        %s\nname:      %s\nowner:     %s\nstate:     %s%s\nattempts: "
      " %d\nslots:     %d\n",
      j.id().c_str(), j.name().c_str(),
      j.owner().empty() ? "-" : j.owner().c_str(), StateName(j.state()).c_str(),
      ending.empty() ? "" : (" (" + ending + ")").c_str(), j.attempts(),
      j.world_size());
  std::printf("priority:  %s%s\n", PriorityWords(j.priority()).c_str(),
              Preemptible(j.spec()) ? "" : ", not preemptible");
  if (!j.waiting().empty()) {
    std::printf("waiting:   #%d in the queue: %s\n", j.queue_position(),
                j.waiting().c_str());
  }
  std::printf(
      "step:      %lld/%lld\nloss:      %s\nval_loss:  %s\ntok/s:     %s\n",
      static_cast<long long>(p.step()), static_cast<long long>(p.total_steps()),
      Figure(HasSteps(p), p.loss()).c_str(),
      Figure(p.has_val_loss(), p.val_loss()).c_str(),
      Figure(HasSteps(p), p.tok_per_s(), 0).c_str());
  if (const std::string note = FiguresNote(j); !note.empty()) {
    std::printf("figures:   %s\n", note.c_str());
  }
  std::printf("uid:       %s\n", j.uid().c_str());
  if (const int spec_dp = JobLayout(j.spec()).degree("dp");
      j.dp() != 0 && j.dp() != spec_dp) {
    std::printf("layout:    shrunk to dp=%d (spec dp=%d)\n", j.dp(), spec_dp);
  }
  if (j.has_plan()) {
    std::printf("planned:   %s\n", PlannedLayoutWords(j.plan()).c_str());
    if (HasSteps(p) && j.plan().step_s() > 0) {
      if (std::optional<MeasuredStep> m = MeasureStep(client, j)) {
        std::printf(
            "measured:  %.4g s a step, the median of %d (%+.0f%% of the "
            "prediction)\n",
            m->seconds, m->steps, 100.0 * (m->seconds / j.plan().step_s() - 1));
      }
    }
  }
  if (j.placement_size() > 0) {
    std::printf("nodes:     %s\n", PlacementWords(j.placement()).c_str());
  }
  if (!j.lineage().from_job().empty()) {
    std::printf("lineage:   from %s at step %lld (%s)\n",
                j.lineage().from_job().c_str(),
                static_cast<long long>(j.lineage().from_step()),
                j.lineage().from_checkpoint().c_str());
  }
  if (j.lineage().extended_from_steps_size() > 0) {
    std::vector<int64_t> steps(j.lineage().extended_from_steps().begin(),
                               j.lineage().extended_from_steps().end());
    steps.push_back(j.spec().train().steps());
    std::printf("lineage:   extended: %s steps\n",
                absl::StrJoin(steps, " → ").c_str());
  }
  std::printf("created:   %s ago\n", Ago(j.created_unix_ms()).c_str());
  if (!j.error().empty()) std::printf("error:     %s\n", j.error().c_str());
  for (const auto& a : resp.attempts()) {
    const std::string end = EndWords(a);
    std::printf(
        "attempt %d: exit %s%s%s  %s\n", a.number(),
        a.exit_code() == -1 ? "—" : std::to_string(a.exit_code()).c_str(),
        end.empty() ? "" : absl::StrCat(" (", end, ")").c_str(),
        a.slurm_job_id().empty()
            ? ""
            : absl::StrCat(" slurm job ", a.slurm_job_id()).c_str(),
        a.dir().c_str());
  }
  return 0;
}

int Priority(Client& client, const std::string& id,
             const std::string& priority) {
  v1::SetJobPriorityRequest req;
  req.set_job_id(id);
  req.set_priority(priority);
  v1::SetJobPriorityResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().SetJobPriority(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
    return 0;
  }
  std::printf("%s priority %s\n", resp.job().id().c_str(),
              PriorityWords(resp.job().priority()).c_str());
  return 0;
}

int Queue(Client& client) {
  v1::ListQueueResponse resp;
  auto ctx = client.Context();
  const grpc::Status s =
      client.stub().ListQueue(ctx.get(), v1::ListQueueRequest(), &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
    return 0;
  }
  PrintQueueTable({resp.jobs().begin(), resp.jobs().end()});
  return 0;
}

int WhoAmI(Client& client) {
  v1::WhoAmIResponse resp;
  auto ctx = client.Context();
  const grpc::Status s =
      client.stub().WhoAmI(ctx.get(), v1::WhoAmIRequest(), &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
    return 0;
  }
  const auto limit = [](int v) {
    return v == 0 ? std::string("-") : absl::StrCat(v);
  };
  std::printf(
      "user:      %s\nrole:      %s\nquota:     slots %s, gpus %s, "
      "running jobs %s\n",
      resp.user().c_str(), resp.role().c_str(),
      limit(resp.quota().slots()).c_str(), limit(resp.quota().gpus()).c_str(),
      limit(resp.quota().running_jobs()).c_str());
  return 0;
}

int List(Client& client, int limit, const std::string& state,
         const std::string& owner, bool mine) {
  v1::ListJobsRequest req;
  req.set_limit(limit);
  req.set_owner(owner);
  if (mine) {
    v1::WhoAmIResponse me;
    auto ctx = client.Context();
    const grpc::Status s =
        client.stub().WhoAmI(ctx.get(), v1::WhoAmIRequest(), &me);
    if (!s.ok()) return RpcError(client.options(), s);
    req.set_owner(me.user());
  }
  if (!state.empty()) {  // one of the names --state's check allows
    req.set_state(StateOfLowerName(absl::AsciiStrToLower(state))
                      .value_or(v1::JOB_STATE_UNSPECIFIED));
  }
  v1::ListJobsResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ListJobs(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
  } else {
    PrintJobsTable({resp.jobs().begin(), resp.jobs().end()});
  }
  return 0;
}

int Cancel(Client& client, const std::string& id) {
  v1::CancelJobRequest req;
  req.set_job_id(id);
  v1::CancelJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().CancelJob(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  PrintJobState(client, resp.job());
  return 0;
}

int Events(Client& client, const std::string& id) {
  v1::ListEventsRequest req;
  req.set_job_id(id);
  v1::ListEventsResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ListEvents(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
    return 0;
  }
  for (const v1::JobHistoryEvent& e : resp.events()) {
    // Local time, as the reader's clock shows it.
    std::printf(
        "%s  %s\n",
        absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(e.unix_ms()),
                         absl::LocalTimeZone())
            .c_str(),
        e.message().c_str());
  }
  return 0;
}

int Delete(Client& client, const std::string& id, bool purge) {
  v1::DeleteJobRequest req;
  req.set_job_id(id);
  req.set_purge(purge);
  v1::DeleteJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().DeleteJob(ctx.get(), req, &resp);
  if (!s.ok()) {
    const int rc = RpcError(client.options(), s);
    // A job that has not ended is the caller's to fix (cancel it first).
    return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION
               ? kExitBadInput
               : rc;
  }
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
    return 0;
  }
  if (resp.checkpoint_dir().empty()) {
    std::printf("%s deleted (it had no checkpoints)\n", id.c_str());
  } else if (resp.purged()) {
    std::printf("%s deleted with its checkpoints (%s)\n", id.c_str(),
                resp.checkpoint_dir().c_str());
  } else {
    std::printf(
        "%s deleted; its checkpoints stay in %s (--purge removes them)\n",
        id.c_str(), resp.checkpoint_dir().c_str());
  }
  return 0;
}

int PauseOrResume(Client& client, const std::string& id, bool pause) {
  v1::Job job;
  auto ctx = client.Context();
  grpc::Status s;
  if (pause) {
    v1::PauseJobRequest req;
    req.set_job_id(id);
    v1::PauseJobResponse resp;
    s = client.stub().PauseJob(ctx.get(), req, &resp);
    job = resp.job();
  } else {
    v1::ResumeJobRequest req;
    req.set_job_id(id);
    v1::ResumeJobResponse resp;
    s = client.stub().ResumeJob(ctx.get(), req, &resp);
    job = resp.job();
  }
  if (!s.ok()) return RpcError(client.options(), s);
  PrintJobState(client, job);
  return 0;
}

int Extend(Client& client, const std::string& id, int64_t steps) {
  v1::ExtendJobRequest req;
  req.set_job_id(id);
  req.set_steps(steps);
  v1::ExtendJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ExtendJob(ctx.get(), req, &resp);
  if (!s.ok()) {
    const int rc = RpcError(client.options(), s);
    // A job that has not succeeded is the caller's to fix.
    return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION
               ? kExitBadInput
               : rc;
  }
  PrintJobState(client, resp.job());
  return 0;
}

int Logs(Client& client, const std::string& id, bool follow, int attempt,
         int rank) {
  v1::StreamLogsRequest req;
  req.set_job_id(id);
  req.set_follow(follow);
  req.set_attempt(attempt);
  auto ctx = client.Context(/*unary=*/false);
  auto reader = client.stub().StreamLogs(ctx.get(), req);
  v1::LogChunk chunk;
  std::map<std::string, std::string> partial;  // by stream
  while (reader->Read(&chunk)) {
    if (rank < 0) {
      std::fwrite(chunk.data().data(), 1, chunk.data().size(), stdout);
    } else {
      std::string& text = partial[chunk.stream()];
      text += chunk.data();
      size_t start = 0, end;
      while ((end = text.find('\n', start)) != std::string::npos) {
        const absl::string_view line(text.data() + start, end - start + 1);
        if (LineOfRank(line, rank)) {
          std::fwrite(line.data(), 1, line.size(), stdout);
        }
        start = end + 1;
      }
      text.erase(0, start);
    }
    std::fflush(stdout);
  }
  const grpc::Status s = reader->Finish();
  return s.ok() ? 0 : RpcError(client.options(), s);
}

int Checkpoints(Client& client, const std::string& id) {
  v1::ListCheckpointsRequest req;
  req.set_job_id(id);
  v1::ListCheckpointsResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ListCheckpoints(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ProtoJson(resp, true).c_str());
    return 0;
  }
  std::printf("%10s %8s  %s\n", "STEP", "ATTEMPT", "DIR");
  for (const auto& c : resp.checkpoints()) {
    std::printf("%10lld %8d  %s\n", static_cast<long long>(c.step()),
                c.attempt(), c.dir().c_str());
  }
  return 0;
}

int Diagnose(Client& client, const std::string& id, int attempt) {
  v1::DiagnoseJobRequest req;
  req.set_job_id(id);
  req.set_attempt(attempt);
  v1::DiagnoseJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().DiagnoseJob(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", resp.json().c_str());
  } else {
    std::printf("%s", resp.text().c_str());
  }
  return 0;
}

}  // namespace ptrain::ptctl
