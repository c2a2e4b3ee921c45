// Jobs that go on from a checkpoint, for the job state machine
// (coordinator.h): a submission `--from` another job's checkpoint of the
// same model (its lineage), and a succeeded job extended to more steps
// from its own last one.
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"
#include "common/job_state.h"
#include "common/spec.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_internal.h"
#include "google/protobuf/util/message_differencer.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// The step-N folders under `dir` by step (a checkpoint's folder name,
// docs/checkpoints.md).
std::map<int64_t, std::string> StepFolders(const std::string& dir) {
  std::map<int64_t, std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if (name.size() >= 13 && absl::StartsWith(name, "step-") &&
        absl::SimpleAtoi(name.substr(5), &step) && it->is_directory(ec)) {
      out[step] = it->path().string();
    }
  }
  return out;
}

// The fields of two models' specs that differ ("model.n_embd");
// model.init_from, where the weights come from, is not the model.
std::vector<std::string> ModelDifferences(const v1::ModelSpec& mine,
                                          const v1::ModelSpec& theirs) {
  using google::protobuf::util::MessageDifferencer;
  struct Names : MessageDifferencer::Reporter {
    std::vector<std::string> out;
    void Add(const std::vector<MessageDifferencer::SpecificField>& path) {
      if (!path.empty() && path.back().field != nullptr) {
        out.push_back(absl::StrCat("model.", path.back().field->name()));
      }
    }
    void ReportAdded(
        const google::protobuf::Message&, const google::protobuf::Message&,
        const std::vector<MessageDifferencer::SpecificField>& p) override {
      Add(p);
    }
    void ReportDeleted(
        const google::protobuf::Message&, const google::protobuf::Message&,
        const std::vector<MessageDifferencer::SpecificField>& p) override {
      Add(p);
    }
    void ReportModified(
        const google::protobuf::Message&, const google::protobuf::Message&,
        const std::vector<MessageDifferencer::SpecificField>& p) override {
      Add(p);
    }
  } names;
  MessageDifferencer d;
  d.IgnoreField(v1::ModelSpec::descriptor()->FindFieldByName("init_from"));
  d.ReportDifferencesTo(&names);
  d.Compare(mine, theirs);
  return names.out;
}

}  // namespace

absl::Status Coordinator::SetForkSource(const std::string& from_job,
                                        int64_t from_step, JobRecord* r) const {
  if (from_job.empty()) return absl::OkStatus();
  if (from_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from ", Echo(from_job), "@", from_step,
                     ": the step must be positive"));
  }
  v1::Job source;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(from_job);
    if (it == jobs_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--from ", Echo(from_job), ": no such job (ptctl list)"));
    }
    source = it->second.record.job;
  }
  const v1::JobSpec& spec = r->job.spec();
  if (const std::vector<std::string> differ =
          ModelDifferences(spec.model(), source.spec().model());
      !differ.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--from ", from_job, ": that job trains another model (",
        absl::StrJoin(differ, ", "),
        " differ); a job goes on only from a checkpoint of its own model"));
  }
  const std::map<int64_t, std::string> steps =
      StepFolders(source.spec().checkpoint().dir());
  if (steps.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from ", from_job, ": it has no checkpoint (under '",
                     source.spec().checkpoint().dir(), "')"));
  }
  auto at = from_step == 0 ? std::prev(steps.end()) : steps.find(from_step);
  if (at == steps.end()) {
    std::vector<int64_t> have;
    for (const auto& [s, dir] : steps) have.push_back(s);
    return absl::InvalidArgumentError(
        absl::StrCat("--from ", from_job, "@", from_step,
                     ": it has no checkpoint at that step (it has steps ",
                     absl::StrJoin(have, ", "), ")"));
  }
  if (at->first > spec.train().steps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--from ", from_job, "@", at->first, ": the step is past train.steps=",
        spec.train().steps(), " (raise it with --set train.steps=N)"));
  }
  v1::Lineage* l = r->job.mutable_lineage();
  l->set_from_job(from_job);
  l->set_from_uid(source.uid());
  l->set_from_step(at->first);
  l->set_from_checkpoint(at->second);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Coordinator::Extend(const std::string& id,
                                            int64_t steps,
                                            const std::string& by) {
  if (id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock lock(&mu_);
  Entry* e = Find(id);
  if (e == nullptr) return UnknownJob(id);
  const v1::Job& now = e->record.job;
  if (now.state() != v1::JOB_STATE_SUCCEEDED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " is ", StateName(now.state()),
        ": only a SUCCEEDED job can be extended (it goes on from its last "
        "step's checkpoint)"));
  }
  const int64_t was = now.spec().train().steps();
  if (steps <= was) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps ", steps, " must be more than the job's ",
                     "train.steps=", was));
  }
  if (now.spec().checkpoint().dir().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " has no checkpoint.dir, so nothing to go on from"));
  }
  JobUpdate u;
  u.record = e->record;
  v1::Job& job = u.record.job;
  job.mutable_spec()->mutable_train()->set_steps(steps);
  if (absl::Status s = ValidateJobSpec(job.spec()); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps ", steps, ": ", s.message()));
  }
  job.mutable_progress()->set_total_steps(steps);
  job.mutable_lineage()->add_extended_from_steps(was);
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_finished_unix_ms(0);
  job.clear_error();
  u.event = absl::StrCat("extended", By(by), " from ", was, " to ", steps,
                         " steps: queued again");
  if (absl::Status s = Commit(*e, std::move(u)); !s.ok()) return s;
  wake_.Signal();
  return e->record.job;
}

}  // namespace ptrain
