// See watch.h.
#include "ptctl/watch.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/exit_codes.h"
#include "common/job_state.h"
#include "ptctl/format.h"

namespace ptrain::ptctl {

namespace {

// Renders one line of progress: bar, step/total, loss, tok/s, ETA.
class ProgressBar {
 public:
  void Update(const v1::Job& j) {
    const auto& p = j.progress();
    const auto now = std::chrono::steady_clock::now();
    if (!started_ || p.step() < start_step_ || j.attempts() != attempt_) {
      started_ = true;
      start_ = now;
      start_step_ = p.step();
      attempt_ = j.attempts();
    }
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? (p.step() - start_step_) / elapsed : 0;
    const double eta = rate > 0 ? (p.total_steps() - p.step()) / rate : NAN;
    const int width = 30;
    const double frac = p.total_steps() > 0
                            ? std::min(1.0, double(p.step()) / p.total_steps())
                            : 0;
    const int filled = static_cast<int>(frac * width);
    std::string bar =
        std::string(filled, '#') + std::string(width - filled, '.');
    std::string line = absl::StrFormat(
        "%s [%s] %lld/%lld loss %s%s tok/s %s ETA %s attempt %d %s", j.id(),
        bar, static_cast<long long>(p.step()),
        static_cast<long long>(p.total_steps()), Figure(HasSteps(p), p.loss()),
        p.has_val_loss() ? absl::StrCat(" val ", Figure(true, p.val_loss()))
                         : "",
        Figure(HasSteps(p), p.tok_per_s(), 0), Duration(eta), j.attempts(),
        StateName(j.state()));
    if (tty_) {
      std::fprintf(stderr, "\r%-*s", static_cast<int>(last_len_), line.c_str());
      last_len_ = line.size();
    } else if (line_due(p.step(), p.total_steps(), j.state())) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }
  void Message(const std::string& text) {
    if (tty_ && last_len_ > 0) std::fprintf(stderr, "\n");
    last_len_ = 0;
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  void End() {
    if (tty_ && last_len_ > 0) std::fprintf(stderr, "\n");
  }

 private:
  // Without a terminal: a line per tenth of the run and per state change.
  bool line_due(int64_t step, int64_t total, v1::JobState state) {
    const bool due = state != last_state_ || step >= next_step_;
    last_state_ = state;
    if (step >= next_step_)
      next_step_ = step + std::max<int64_t>(1, total / 10);
    return due;
  }
  const bool tty_ = isatty(2);
  size_t last_len_ = 0;
  bool started_ = false;
  std::chrono::steady_clock::time_point start_;
  int64_t start_step_ = 0;
  int attempt_ = 0;
  int64_t next_step_ = 0;
  v1::JobState last_state_ = v1::JOB_STATE_UNSPECIFIED;
};

// What Ctrl-C prints while a job is watched; written by the signal
// handler, so prepared before it is installed and never freed.
char interrupted_message[512];
size_t interrupted_length = 0;

void OnInterrupt(int) {
  // Only async-signal-safe calls here.
  const ssize_t written =
      write(STDERR_FILENO, interrupted_message, interrupted_length);
  (void)written;
  _exit(kExitInterrupted);
}

// From now on Ctrl-C stops watching job `id` and says that the job, which
// is ptcoord's, goes on, and how to cancel it (a user may think it ends
// with ptctl).
void ExplainInterruptFor(const std::string& id) {
  const int n = std::snprintf(
      interrupted_message, sizeof(interrupted_message),
      "%sptctl: stopped watching; %s keeps running on ptcoord: `ptctl cancel "
      "%s` cancels it, `ptctl watch %s` follows it again\n",
      isatty(STDERR_FILENO) ? "\n" : "", id.c_str(), id.c_str(), id.c_str());
  interrupted_length =
      std::min(sizeof(interrupted_message) - 1, static_cast<size_t>(n));
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
}

int OutcomeExitCode(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_SUCCEEDED:
      return 0;
    case v1::JOB_STATE_CANCELLED:
      return kExitCancelled;
    default:
      return kExitFailed;
  }
}

}  // namespace

int Watch(Client& client, const std::string& id) {
  ExplainInterruptFor(id);
  ProgressBar bar;
  std::string last_message;
  bool connected = false;
  auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (true) {
    auto ctx = client.Context(/*unary=*/false);
    v1::WatchJobRequest req;
    req.set_job_id(id);
    auto reader = client.stub().WatchJob(ctx.get(), req);
    v1::JobEvent ev;
    std::optional<v1::Job> last;
    while (reader->Read(&ev)) {
      connected = true;
      give_up = std::chrono::steady_clock::now() + std::chrono::minutes(2);
      // "": nothing happened to the job since ptcoord started (a job that
      // had ended before it restarted): its state says it all.
      if (ev.message() != "progress" && !ev.message().empty() &&
          ev.message() != last_message) {
        bar.Message(absl::StrCat(ev.job().id(), ": ", ev.message()));
        last_message = ev.message();
      }
      bar.Update(ev.job());
      last = ev.job();
    }
    const grpc::Status s = reader->Finish();
    if (last.has_value() && IsFinal(last->state())) {
      bar.End();
      if (!last->error().empty() && last->state() != v1::JOB_STATE_SUCCEEDED) {
        std::fprintf(stderr, "error: %s\n", last->error().c_str());
      }
      std::printf("%s %s\n", last->id().c_str(),
                  StateName(last->state()).c_str());
      return OutcomeExitCode(last->state());
    }
    // A coordinator restart breaks the stream; the job goes on, so do we.
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE &&
        s.error_code() != grpc::StatusCode::CANCELLED && !s.ok()) {
      bar.End();
      return RpcError(client.options(), s);
    }
    if (!connected || std::chrono::steady_clock::now() > give_up) {
      bar.End();
      return RpcError(client.options(), s);
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

}  // namespace ptrain::ptctl
