// gRPC callback services for ptcoord; see service.h. Streams run their loop
// on a thread of their own that blocks on the coordinator, so no gRPC
// callback thread ever waits. TLS, when configured, is gRPC's (OpenSSL).
#include "coordinator/service.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/job_state.h"
#include "common/thread_entry.h"
#include "coordinator/access.h"
#include "ptrain/v1/coordinator.grpc.pb.h"
#include "ptrain/v1/node.grpc.pb.h"

namespace ptrain {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

namespace {

std::optional<std::string> Authorization(grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

// `check` of a credential of `kind` through the coordinator's throttle on
// failed authentication: a peer that failed too often is refused
// (RESOURCE_EXHAUSTED, saying why) before anything is checked.
absl::Status Throttled(Coordinator* c, grpc::CallbackServerContext* ctx,
                       CredentialKind kind,
                       absl::FunctionRef<absl::Status()> check) {
  return c->auth_throttle().Check(PeerKeyOfGrpcPeer(ctx->peer()), kind,
                                  Authorization(ctx).has_value(), check,
                                  absl::Now());
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx,
                               const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

// A server stream whose body runs on its own thread: `body(write)` calls
// write(msg) for each message (false once the client is gone) and returns
// the final status.
template <typename T>
class ThreadedWriter : public grpc::ServerWriteReactor<T> {
 public:
  using Write = std::function<bool(const T&)>;
  using Body = std::function<absl::Status(const Write&,
                                          const std::atomic<bool>& cancelled)>;

  explicit ThreadedWriter(Body body) {
    thread_ =
        std::thread(ThreadEntry("rpc-stream", [this, body = std::move(body)] {
          const absl::Status s =
              body([this](const T& m) { return WriteOne(m); }, cancelled_);
          this->Finish(ToGrpc(s));
        }));
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    write_ok_ = ok;
    write_done_ = true;
    cv_.notify_all();
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    thread_.join();
    delete this;
  }

 private:
  bool WriteOne(const T& m) {
    if (cancelled_) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_done_ = false;
    }
    this->StartWrite(&m);
    // `m` must live until OnWriteDone, which gRPC always calls.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return write_done_; });
    return write_ok_ && !cancelled_;
  }

  std::thread thread_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool write_done_ = true;
  bool write_ok_ = true;
};

// A unary call whose body may wait (for ranks to answer): it runs on a
// thread of its own, which finishes the call.
class ThreadedUnary : public grpc::ServerUnaryReactor {
 public:
  explicit ThreadedUnary(std::function<absl::Status()> body) {
    std::lock_guard<std::mutex> lock(mu_);
    thread_ =
        std::thread(ThreadEntry("rpc-call", [this, body = std::move(body)] {
          const absl::Status s = body();
          { std::lock_guard<std::mutex> lock(mu_); }  // thread_ is set
          Finish(ToGrpc(s));
        }));
  }
  void OnDone() override {
    // gRPC may call this on the thread that finished the call.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
    delete this;
  }

 private:
  std::mutex mu_;
  std::thread thread_;
};

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  JobServiceImpl(Coordinator* c, bool require_client_cert)
      : c_(c), require_client_cert_(require_client_cert) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const v1::SubmitJobRequest* req,
                                      v1::SubmitJobResponse* resp) override {
    Call call(this, ctx, "SubmitJob", req->dry_run() ? "dry run" : "");
    if (!call.ok()) return call.Done();
    std::vector<std::string> overrides(req->overrides().begin(),
                                       req->overrides().end());
    if (req->dry_run()) {
      absl::StatusOr<v1::DryRun> d = c_->DryRunSubmit(
          req->spec_yaml(), overrides, req->from_job(), req->from_step());
      if (d.ok()) *resp->mutable_dry_run() = std::move(*d);
      return call.Done(d.status());
    }
    absl::StatusOr<v1::Job> job =
        c_->Submit(req->spec_yaml(), overrides, req->from_job(),
                   req->from_step(), call.caller());
    if (job.ok()) {
      call.set_target(job->id());
      *resp->mutable_job() = std::move(*job);
    }
    return call.Done(job.status());
  }

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const v1::GetJobRequest* req,
                                   v1::GetJobResponse* resp) override {
    Call call(this, ctx, "GetJob", req->job_id());
    if (!call.ok()) return call.Done();
    absl::StatusOr<v1::GetJobResponse> r =
        c_->Get(req->job_id(), req->include_loss_history());
    if (r.ok()) *resp = std::move(*r);
    return call.Done(r.status());
  }

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override {
    Call call(this, ctx, "ListJobs");
    if (!call.ok()) return call.Done();
    absl::StatusOr<std::vector<v1::Job>> jobs =
        c_->List(req->state(), req->limit(), req->owner());
    if (jobs.ok()) {
      for (v1::Job& j : *jobs) *resp->add_jobs() = std::move(j);
    }
    return call.Done(jobs.status());
  }

  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req,
                                      v1::CancelJobResponse* resp) override {
    Call call(this, ctx, "CancelJob", req->job_id());
    if (!call.ok()) return call.Done();
    absl::StatusOr<v1::Job> job = c_->Cancel(req->job_id(), call.user());
    if (job.ok()) *resp->mutable_job() = std::move(*job);
    return call.Done(job.status());
  }

  grpc::ServerUnaryReactor* ListEvents(grpc::CallbackServerContext* ctx,
                                       const v1::ListEventsRequest* req,
                                       v1::ListEventsResponse* resp) override {
    Call call(this, ctx, "ListEvents", req->job_id());
    if (!call.ok()) return call.Done();
    if (req->job_id().empty()) {
      return call.Done(absl::InvalidArgumentError("job_id is empty"));
    }
    auto events = c_->Events(req->job_id());
    if (events.ok()) {
      for (auto& [unix_ms, message] : *events) {
        v1::JobHistoryEvent* e = resp->add_events();
        e->set_unix_ms(unix_ms);
        e->set_message(std::move(message));
      }
    }
    return call.Done(events.status());
  }

  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override {
    Call call(this, ctx, "DeleteJob", req->job_id());
    if (!call.ok()) return call.Done();
    absl::StatusOr<v1::DeleteJobResponse> r =
        c_->Delete(req->job_id(), req->purge());
    if (r.ok()) *resp = std::move(*r);
    return call.Done(r.status());
  }

  grpc::ServerUnaryReactor* PauseJob(grpc::CallbackServerContext* ctx,
                                     const v1::PauseJobRequest* req,
                                     v1::PauseJobResponse* resp) override {
    Call call(this, ctx, "PauseJob", req->job_id());
    if (!call.ok()) return call.Done();
    absl::StatusOr<v1::Job> job = c_->Pause(req->job_id(), call.user());
    if (job.ok()) *resp->mutable_job() = std::move(*job);
    return call.Done(job.status());
  }

  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* ctx,
                                      const v1::ResumeJobRequest* req,
                                      v1::ResumeJobResponse* resp) override {
    Call call(this, ctx, "ResumeJob", req->job_id());
    if (!call.ok()) return call.Done();
    absl::StatusOr<v1::Job> job = c_->Resume(req->job_id(), call.user());
    if (job.ok()) *resp->mutable_job() = std::move(*job);
    return call.Done(job.status());
  }

  grpc::ServerUnaryReactor* ExtendJob(grpc::CallbackServerContext* ctx,
                                      const v1::ExtendJobRequest* req,
                                      v1::ExtendJobResponse* resp) override {
    Call call(this, ctx, "ExtendJob", req->job_id());
    if (!call.ok()) return call.Done();
    absl::StatusOr<v1::Job> job =
        c_->Extend(req->job_id(), req->steps(), call.user());
    if (job.ok()) *resp->mutable_job() = std::move(*job);
    return call.Done(job.status());
  }

  grpc::ServerUnaryReactor* ListCheckpoints(
      grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest* req,
      v1::ListCheckpointsResponse* resp) override {
    Call call(this, ctx, "ListCheckpoints", req->job_id());
    if (!call.ok()) return call.Done();
    absl::StatusOr<std::vector<v1::Checkpoint>> cps =
        c_->Checkpoints(req->job_id());
    if (cps.ok()) {
      for (v1::Checkpoint& c : *cps) *resp->add_checkpoints() = std::move(c);
    }
    return call.Done(cps.status());
  }

  grpc::ServerUnaryReactor* DiagnoseJob(
      grpc::CallbackServerContext* ctx, const v1::DiagnoseJobRequest* req,
      v1::DiagnoseJobResponse* resp) override {
    auto call = std::make_shared<Call>(this, ctx, "DiagnoseJob", req->job_id());
    if (!call->ok()) return call->Done();
    Coordinator* c = c_;
    return new ThreadedUnary([c, req, resp, call] {
      absl::StatusOr<v1::DiagnoseJobResponse> d =
          c->Diagnose(req->job_id(), req->attempt());
      if (d.ok()) *resp = std::move(*d);
      call->Audit(d.status());
      return d.status();
    });
  }

  grpc::ServerUnaryReactor* SetJobPriority(
      grpc::CallbackServerContext* ctx, const v1::SetJobPriorityRequest* req,
      v1::SetJobPriorityResponse* resp) override {
    Call call(this, ctx, "SetJobPriority", req->job_id());
    if (!call.ok()) return call.Done();
    absl::StatusOr<v1::Job> job =
        c_->SetPriority(req->job_id(), req->priority(), call.user());
    if (job.ok()) *resp->mutable_job() = std::move(*job);
    return call.Done(job.status());
  }

  grpc::ServerUnaryReactor* ListQueue(grpc::CallbackServerContext* ctx,
                                      const v1::ListQueueRequest*,
                                      v1::ListQueueResponse* resp) override {
    Call call(this, ctx, "ListQueue");
    if (!call.ok()) return call.Done();
    for (v1::Job& j : c_->Queue()) *resp->add_jobs() = std::move(j);
    return call.Done(absl::OkStatus());
  }

  grpc::ServerUnaryReactor* WhoAmI(grpc::CallbackServerContext* ctx,
                                   const v1::WhoAmIRequest*,
                                   v1::WhoAmIResponse* resp) override {
    Call call(this, ctx, "WhoAmI");
    if (!call.ok()) return call.Done();
    resp->set_user(call.user());
    resp->set_role(RoleName(call.caller().role));
    if (const User* u = c_->UsersNow()->Find(call.user()); u != nullptr) {
      resp->mutable_quota()->set_slots(u->quota.slots);
      resp->mutable_quota()->set_gpus(u->quota.gpus);
      resp->mutable_quota()->set_running_jobs(u->quota.running_jobs);
    }
    return call.Done(absl::OkStatus());
  }

  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* ctx,
      const v1::WatchJobRequest* req) override {
    const absl::Status auth =
        Call(this, ctx, "WatchJob", req->job_id()).status();
    const std::string id = req->job_id();
    Coordinator* c = c_;
    return new ThreadedWriter<v1::JobEvent>(
        [auth, id, c](const auto& write,
                      const std::atomic<bool>& cancelled) -> absl::Status {
          if (!auth.ok()) return auth;
          uint64_t seen = 0;
          while (!cancelled) {
            absl::StatusOr<Coordinator::Snapshot> snap =
                c->WaitForChange(id, seen, absl::Seconds(1));
            if (!snap.ok()) return snap.status();
            if (snap->version == seen)
              continue;  // timeout: look at `cancelled`
            seen = snap->version;
            v1::JobEvent ev;
            *ev.mutable_job() = snap->job;
            ev.mutable_job()
                ->clear_spec();  // sent once by GetJob, not per step
            ev.set_message(snap->message);
            ev.set_unix_ms(NowMs());
            if (!write(ev)) return absl::CancelledError("client went away");
            if (IsFinal(snap->job.state())) return absl::OkStatus();
          }
          return absl::CancelledError("client went away");
        });
  }

  grpc::ServerWriteReactor<v1::LogChunk>* StreamLogs(
      grpc::CallbackServerContext* ctx,
      const v1::StreamLogsRequest* req) override {
    const absl::Status auth =
        Call(this, ctx, "StreamLogs", req->job_id()).status();
    const v1::StreamLogsRequest r = *req;
    Coordinator* c = c_;
    return new ThreadedWriter<v1::LogChunk>(
        [auth, r, c](const auto& write,
                     const std::atomic<bool>& cancelled) -> absl::Status {
          if (!auth.ok()) return auth;
          absl::StatusOr<Coordinator::LogSource> src =
              c->Logs(r.job_id(), r.attempt());
          // Following a job that is still queued: wait for its first attempt.
          uint64_t seen = 0;
          while (r.follow() && !cancelled && !src.ok() &&
                 src.status().code() == absl::StatusCode::kNotFound) {
            absl::StatusOr<Coordinator::Snapshot> snap =
                c->WaitForChange(r.job_id(), seen, absl::Seconds(1));
            if (!snap.ok() || IsFinal(snap->job.state())) break;
            seen = snap->version;
            src = c->Logs(r.job_id(), r.attempt());
          }
          if (!src.ok()) return src.status();
          struct File {
            const char* stream;
            std::string path;
            int64_t offset = 0;
          };
          File files[] = {{"stdout", src->dir + "/stdout.log"},
                          {"stderr", src->dir + "/stderr.log"}};
          constexpr size_t kChunk = 64 << 10;
          while (!cancelled) {
            // Decide "finished" before reading, so no byte written before the
            // end is missed.
            bool finished = src->finished;
            if (!finished) {
              absl::StatusOr<Coordinator::LogSource> now =
                  c->Logs(r.job_id(), src->attempt);
              finished = !now.ok() || now->finished;
            }
            bool any = false;
            for (File& f : files) {
              // The ranks' file: a FIFO or a link there ends the stream
              // saying so, rather than blocking or reading /dev/zero.
              absl::StatusOr<BoundedFile> in =
                  BoundedFile::Open("", f.path, Symlinks::kRefuse);
              if (absl::IsNotFound(in.status())) continue;
              if (!in.ok())
                return absl::FailedPreconditionError(in.status().message());
              while (!cancelled) {
                absl::StatusOr<std::string> buf = in->ReadAt(f.offset, kChunk);
                if (!buf.ok()) return buf.status();
                if (buf->empty()) break;
                f.offset += static_cast<int64_t>(buf->size());
                any = true;
                v1::LogChunk chunk;
                chunk.set_attempt(src->attempt);
                chunk.set_stream(f.stream);
                chunk.set_data(*std::move(buf));
                if (!write(chunk))
                  return absl::CancelledError("client went away");
                if (chunk.data().size() < kChunk) break;
              }
            }
            if (!r.follow() || (finished && !any)) return absl::OkStatus();
            if (!any) absl::SleepFor(absl::Milliseconds(200));
          }
          return absl::CancelledError("client went away");
        });
  }

  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx,
                                      const v1::ListNodesRequest*,
                                      v1::ListNodesResponse* resp) override {
    Call call(this, ctx, "ListNodes");
    if (!call.ok()) return call.Done();
    for (v1::Node& n : c_->ListNodes()) *resp->add_nodes() = std::move(n);
    return call.Done(absl::OkStatus());
  }

  grpc::ServerUnaryReactor* DrainNode(grpc::CallbackServerContext* ctx,
                                      const v1::DrainNodeRequest* req,
                                      v1::DrainNodeResponse* resp) override {
    Call call(this, ctx, "DrainNode", req->name());
    if (!call.ok()) return call.Done();
    if (req->name().empty()) {
      return call.Done(absl::InvalidArgumentError("name is empty"));
    }
    absl::StatusOr<v1::Node> n = c_->DrainNode(req->name(), req->drain());
    if (n.ok()) *resp->mutable_node() = std::move(*n);
    return call.Done(n.status());
  }

  grpc::ServerUnaryReactor* ForgetNode(grpc::CallbackServerContext* ctx,
                                       const v1::ForgetNodeRequest* req,
                                       v1::ForgetNodeResponse*) override {
    Call call(this, ctx, "ForgetNode", req->name());
    if (!call.ok()) return call.Done();
    if (req->name().empty()) {
      return call.Done(absl::InvalidArgumentError("name is empty"));
    }
    return call.Done(c_->ForgetNode(req->name()));
  }

  grpc::ServerUnaryReactor* ApproveNode(
      grpc::CallbackServerContext* ctx, const v1::ApproveNodeRequest* req,
      v1::ApproveNodeResponse* resp) override {
    Call call(this, ctx, "ApproveNode", req->name());
    if (!call.ok()) return call.Done();
    if (req->name().empty()) {
      return call.Done(absl::InvalidArgumentError("name is empty"));
    }
    absl::StatusOr<v1::Node> n = c_->ApproveNode(req->name());
    if (n.ok()) *resp->mutable_node() = std::move(*n);
    return call.Done(n.status());
  }

 private:
  // One request: its caller authenticated (through the throttle) and the
  // rule `rpc` of the access table checked, for a job's rule against the
  // job's owner. Done() finishes a unary call; an audited rule's outcome,
  // refusals included, goes to the audit log (once).
  class Call {
   public:
    Call(const JobServiceImpl* s, grpc::CallbackServerContext* ctx,
         absl::string_view rpc, std::string target = "")
        : s_(s),
          ctx_(ctx),
          rule_(FindAccessRule(rpc)),
          rpc_(rpc),
          target_(std::move(target)),
          peer_(ctx->peer()) {
      status_ = s_->Check(ctx, rule_, target_, &caller_);
    }
    bool ok() const { return status_.ok(); }
    const absl::Status& status() const { return status_; }
    const Caller& caller() const { return caller_; }
    const std::string& user() const { return caller_.user; }
    void set_target(std::string t) { target_ = std::move(t); }
    // Writes the outcome `s` when the rule is audited.
    void Audit(const absl::Status& s) {
      if (audited_ || (rule_ != nullptr && !rule_->audited)) return;
      audited_ = true;
      s_->c_->audit().Write(
          AuditRecord{NowMs(), caller_.user,
                      caller_.user.empty() ? "" : RoleName(caller_.role), peer_,
                      rpc_, target_, s});
    }
    grpc::ServerUnaryReactor* Done(const absl::Status& s) {
      Audit(s);
      return ptrain::Done(ctx_, s);
    }
    grpc::ServerUnaryReactor* Done() { return Done(status_); }

   private:
    const JobServiceImpl* const s_;
    grpc::CallbackServerContext* const ctx_;
    const AccessRule* const rule_;
    const std::string rpc_;
    std::string target_;
    const std::string peer_;
    absl::Status status_;
    Caller caller_;
    bool audited_ = false;
  };

  // Authenticates the caller into `caller`, then checks `rule` (null: the
  // table has none, refused) on job `job`.
  absl::Status Check(grpc::CallbackServerContext* ctx, const AccessRule* rule,
                     const std::string& job, Caller* caller) const {
    const absl::Status auth = Throttled(c_, ctx, CredentialKind::kUser, [&] {
      absl::StatusOr<Caller> who = CheckCredentials(ctx);
      if (who.ok()) *caller = *who;
      return who.status();
    });
    if (!auth.ok()) return auth;
    if (rule == nullptr) {
      return absl::PermissionDeniedError(
          "this RPC has no rule in the access table");
    }
    std::string owner;
    if (rule->access == Access::kOwnJob && caller->role == Role::kMember) {
      absl::StatusOr<std::string> o = c_->JobOwner(job);
      if (!o.ok()) return o.status();
      owner = *o;
    }
    return Authorize(*caller, *rule, job, owner);
  }

  // With --tls-client-ca, a verified client certificate first; then the
  // user token either way.
  absl::StatusOr<Caller> CheckCredentials(
      grpc::CallbackServerContext* ctx) const {
    if (require_client_cert_) {
      const std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
      if (auth == nullptr || !auth->IsPeerAuthenticated()) {
        return absl::UnauthenticatedError(
            "this coordinator requires a client certificate signed by its "
            "--tls-client-ca (ptctl --tls-cert/--tls-key)");
      }
    }
    return c_->AuthenticateUser(Authorization(ctx));
  }

  Coordinator* const c_;
  const bool require_client_cert_;
};

// Nodes authenticate with the cluster's join token.
class NodeServiceImpl final : public v1::NodeService::CallbackService {
 public:
  explicit NodeServiceImpl(Coordinator* c) : c_(c), nodes_(&c->nodes()) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterNodeRequest* req,
                                     v1::RegisterNodeResponse* resp) override {
    if (absl::Status a = AuthenticateNode(ctx); !a.ok()) {
      return Done(ctx, a);
    }
    absl::StatusOr<v1::RegisterNodeResponse> r =
        nodes_->Register(*req, absl::Now(), ctx->peer());
    if (r.ok()) *resp = std::move(*r);
    return Done(ctx, r.status());
  }
  grpc::ServerUnaryReactor* Heartbeat(
      grpc::CallbackServerContext* ctx, const v1::NodeHeartbeatRequest* req,
      v1::NodeHeartbeatResponse* resp) override {
    if (absl::Status a = AuthenticateNode(ctx); !a.ok()) {
      return Done(ctx, a);
    }
    bool pending = false;
    absl::Status s = nodes_->Heartbeat(*req, absl::Now(), &pending);
    if (s.ok()) {
      resp->set_pending_approval(pending);
      for (std::string& uid : c_->AttemptsOnNode(req->name())) {
        resp->add_attempt_uids(std::move(uid));
      }
    }
    return Done(ctx, s);
  }
  grpc::ServerUnaryReactor* AuthorizeExec(
      grpc::CallbackServerContext* ctx, const v1::AuthorizeExecRequest* req,
      v1::AuthorizeExecResponse* resp) override {
    if (absl::Status a = AuthenticateNode(ctx); !a.ok()) {
      return Done(ctx, a);
    }
    absl::StatusOr<v1::AuthorizeExecResponse> r = c_->AuthorizeExec(*req);
    if (r.ok()) *resp = std::move(*r);
    return Done(ctx, r.status());
  }

 private:
  absl::Status AuthenticateNode(grpc::CallbackServerContext* ctx) {
    return Throttled(c_, ctx, CredentialKind::kNode, [&] {
      return nodes_->AuthenticateNode(Authorization(ctx));
    });
  }

  Coordinator* const c_;
  NodeRegistry* const nodes_;
};

class RankServiceImpl final : public v1::RankService::CallbackService {
 public:
  explicit RankServiceImpl(Coordinator* c) : c_(c) {}

  grpc::ServerUnaryReactor* ReportProgress(
      grpc::CallbackServerContext* ctx, const v1::ReportProgressRequest* req,
      v1::ReportProgressResponse*) override {
    if (absl::Status a = AuthenticateRank(ctx, req->job_id()); !a.ok()) {
      return Done(ctx, a);
    }
    return Done(ctx, c_->ReportProgress(*req));
  }
  grpc::ServerUnaryReactor* ReportCheckpoint(
      grpc::CallbackServerContext* ctx, const v1::ReportCheckpointRequest* req,
      v1::ReportCheckpointResponse*) override {
    if (absl::Status a = AuthenticateRank(ctx, req->job_id()); !a.ok()) {
      return Done(ctx, a);
    }
    return Done(ctx, c_->ReportCheckpoint(*req));
  }
  grpc::ServerUnaryReactor* ReportEndpoint(
      grpc::CallbackServerContext* ctx, const v1::ReportEndpointRequest* req,
      v1::ReportEndpointResponse*) override {
    if (absl::Status a = AuthenticateRank(ctx, req->job_id()); !a.ok()) {
      return Done(ctx, a);
    }
    return Done(ctx, c_->ReportEndpoint(*req));
  }
  grpc::ServerUnaryReactor* ReportAlive(grpc::CallbackServerContext* ctx,
                                        const v1::ReportAliveRequest* req,
                                        v1::ReportAliveResponse*) override {
    if (absl::Status a = AuthenticateRank(ctx, req->job_id()); !a.ok()) {
      return Done(ctx, a);
    }
    return Done(ctx, c_->ReportAlive(*req));
  }

 private:
  absl::Status AuthenticateRank(grpc::CallbackServerContext* ctx,
                                const std::string& job_id) {
    return Throttled(c_, ctx, CredentialKind::kRank, [&] {
      return c_->AuthenticateRank(job_id, Authorization(ctx));
    });
  }

  Coordinator* const c_;
};

}  // namespace

absl::StatusOr<RunningServer> StartServer(const std::string& listen,
                                          Coordinator* coordinator,
                                          const ServerTls& tls) {
  if (tls.cert_pem.empty() != tls.key_pem.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate and its key");
  }
  if (tls.cert_pem.empty() && !tls.client_ca_pem.empty()) {
    return absl::InvalidArgumentError(
        "a client CA needs TLS: give a certificate and key too");
  }
  RunningServer out;
  const bool client_certs = !tls.client_ca_pem.empty();
  out.jobs = std::make_unique<JobServiceImpl>(coordinator, client_certs);
  out.ranks = std::make_unique<RankServiceImpl>(coordinator);
  out.nodes = std::make_unique<NodeServiceImpl>(coordinator);
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::InsecureServerCredentials();
  if (!tls.cert_pem.empty()) {
    grpc::SslServerCredentialsOptions ssl(
        client_certs ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                     : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_root_certs = tls.client_ca_pem;
    ssl.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, credentials, &out.port);
  builder.RegisterService(out.jobs.get());
  builder.RegisterService(out.ranks.get());
  builder.RegisterService(out.nodes.get());
  // Room for a 1 MiB spec plus overrides; a bigger message is refused by
  // gRPC (RESOURCE_EXHAUSTED) before it is read.
  builder.SetMaxReceiveMessageSize(4 << 20);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  return out;
}

}  // namespace ptrain
