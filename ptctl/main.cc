// ptctl: the command line over ptcoord's JobService (submit, get, list, logs,
// cancel, watch, checkpoints), in plain text or TLS (--tls-ca). Spec files
// are checked here with the same library ptcoord uses, before anything is
// sent.
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/exit_codes.h"
#include "common/header_value.h"
#include "common/job_state.h"
#include "common/pem.h"
#include "common/spec.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/coordinator.grpc.pb.h"

namespace {

using ptrain::v1::JobService;

using ptrain::EndName;
using ptrain::IsFinal;
using ptrain::kExitBadInput;
using ptrain::kExitCancelled;
using ptrain::kExitFailed;
using ptrain::kExitInterrupted;
using ptrain::StateName;

constexpr char kDefaultServer[] = "127.0.0.1:7070";

struct Options {
  std::string server = kDefaultServer;
  std::string token;
  std::string output = "table";
  // TLS: the CA that signed ptcoord's certificate (turns TLS on), and this
  // client's certificate and key when ptcoord asks for one.
  std::string tls_ca, tls_cert, tls_key;
  // Where each came from, for messages: the flag, or the environment
  // variable when the flag was not given.
  std::string server_from;  // "" when the default
  std::string token_from = "--token", tls_ca_from = "--tls-ca",
              tls_cert_from = "--tls-cert", tls_key_from = "--tls-key";
};

// Everything given that goes into a header, checked before any call: gRPC
// aborts the process on a header value it refuses.
absl::Status CheckHeaderValues(const Options& o) {
  if (o.token.empty()) return absl::OkStatus();  // no authorization header
  return ptrain::CheckHeaderValue(o.token_from, o.token);
}

// The channel to ptcoord: TLS when a CA is given, else plain text. Every
// setting is checked first, so that a wrong one is an error naming it
// (exit 2) rather than a failed call. Reconnecting is capped at a couple
// of seconds, so `watch` picks a restarted coordinator up at once (gRPC's
// own backoff grows to 120 s).
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const Options& o) {
  if (absl::Status s = CheckHeaderValues(o); !s.ok()) return s;
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (o.tls_ca.empty() && (!o.tls_cert.empty() || !o.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "--tls-cert/--tls-key need --tls-ca (or PTCTL_TLS_CA)");
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!o.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca =
        ptrain::ReadCertificateFile(o.tls_ca_from, o.tls_ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!o.tls_cert.empty()) {
      absl::StatusOr<std::string> cert =
          ptrain::ReadCertificateFile(o.tls_cert_from, o.tls_cert);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key =
          ptrain::ReadPemFile(o.tls_key_from, o.tls_key);
      if (!key.ok()) return key.status();
      // gRPC would only fail the handshake, as "empty address list".
      if (absl::Status s =
              ptrain::CheckKeyPair(o.tls_cert_from, o.tls_cert, *cert,
                                   o.tls_key_from, o.tls_key, *key);
          !s.ok()) {
        return s;
      }
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // A cluster's whole job list outgrows gRPC's default 4 MiB after a few
  // thousand jobs (a failed job carries its last stderr lines).
  args.SetMaxReceiveMessageSize(256 << 20);
  return grpc::CreateCustomChannel(o.server, credentials, args);
}

// How an ended attempt ended, in words ("paused", "node lost"): a pause
// or a cancel ends an attempt with a non-zero exit code that is no failure.
std::string EndWords(const ptrain::v1::Attempt& a) {
  if (a.finished_unix_ms() == 0) return "running";
  if (a.end() == ptrain::v1::ATTEMPT_END_UNSPECIFIED) {
    // Ended under a ptcoord that did not record why.
    return a.error().empty() ? "" : "failed";
  }
  std::string words = EndName(a.end());
  std::replace(words.begin(), words.end(), '_', ' ');
  return words;
}

// A figure, or "—" for one never measured, which is not a 0.
std::string Figure(bool measured, double value, int decimals = 4) {
  return measured ? absl::StrFormat("%.*f", decimals, value) : "—";
}

// The figures a job reports with its steps exist once it trained one.
bool HasSteps(const ptrain::v1::Progress& p) { return p.step() > 0; }

// `text` right-aligned in `width` columns ("—" is one column, three bytes).
std::string PadLeft(const std::string& text, size_t width) {
  size_t columns = 0;
  for (unsigned char c : text) columns += (c & 0xC0) != 0x80;
  return std::string(width > columns ? width - columns : 0, ' ') + text;
}

// The job states by the names --state takes: StateName in lower case.
std::vector<std::string> StateFlagNames() {
  std::vector<std::string> out;
  for (int s = ptrain::v1::JobState_MIN; s <= ptrain::v1::JobState_MAX; ++s) {
    if (ptrain::v1::JobState_IsValid(s) &&
        s != ptrain::v1::JOB_STATE_UNSPECIFIED) {
      out.push_back(absl::AsciiStrToLower(
          StateName(static_cast<ptrain::v1::JobState>(s))));
    }
  }
  return out;
}

int OutcomeExitCode(ptrain::v1::JobState s) {
  switch (s) {
    case ptrain::v1::JOB_STATE_SUCCEEDED:
      return 0;
    case ptrain::v1::JOB_STATE_CANCELLED:
      return kExitCancelled;
    default:
      return kExitFailed;
  }
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;  // the names of the proto and the YAML
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string Ago(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const int64_t s = std::max<int64_t>(0, (now - unix_ms) / 1000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 7200) return absl::StrCat(s / 60, "m");
  return absl::StrCat(s / 3600, "h");
}

std::string Duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600)
    return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

class Client {
 public:
  Client(const Options& o, std::shared_ptr<grpc::Channel> channel)
      : o_(o), stub_(JobService::NewStub(std::move(channel))) {}

  // A context carrying the token; unary calls get a deadline.
  std::unique_ptr<grpc::ClientContext> Context(bool unary = true) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!o_.token.empty())
      ctx->AddMetadata("authorization", absl::StrCat("Bearer ", o_.token));
    if (unary)
      ctx->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(30));
    return ctx;
  }
  JobService::Stub& stub() { return *stub_; }
  const Options& options() const { return o_; }

 private:
  const Options o_;
  std::unique_ptr<JobService::Stub> stub_;
};

const char* CodeName(grpc::StatusCode c) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

// Whether `address` (HOST:PORT) answers a TLS handshake: to a plain-text
// call, a TLS port only closes the connection. Certificates are not checked
// and nothing is sent: the handshake only tells what the port speaks.
bool SpeaksTls(const std::string& address) {
  if (absl::StrContains(address, "://") || absl::StartsWith(address, "unix:"))
    return false;
  BIO* connection = BIO_new_connect(address.c_str());
  if (connection == nullptr) return false;
  if (BIO_do_connect(connection) <= 0) {
    BIO_free_all(connection);
    ERR_clear_error();
    return false;
  }
  // A port that takes the connection and never answers is not TLS either.
  const timeval patience{5, 0};
  setsockopt(static_cast<int>(BIO_get_fd(connection, nullptr)), SOL_SOCKET,
             SO_RCVTIMEO, &patience, sizeof(patience));
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(
      SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(
      ctx == nullptr ? nullptr : SSL_new(ctx.get()), SSL_free);
  if (ssl == nullptr) {
    BIO_free_all(connection);
    ERR_clear_error();
    return false;
  }
  SSL_set_bio(ssl.get(), connection, connection);            // ssl owns it now
  static constexpr unsigned char kAlpnH2[] = {2, 'h', '2'};  // as gRPC asks
  SSL_set_alpn_protos(ssl.get(), kAlpnH2, sizeof(kAlpnH2));
  // A TLS alert (say, for a client certificate it wants) is TLS too.
  const bool tls =
      SSL_connect(ssl.get()) == 1 ||
      ERR_GET_REASON(ERR_peek_last_error()) >= SSL_AD_REASON_OFFSET;
  ERR_clear_error();
  return tls;
}

// A failed call's message, with what to do about the failures a new user
// meets first: no ptcoord there, TLS on one side only, no or a wrong token.
std::string Explained(const Options& o, const grpc::Status& s) {
  const std::string& m = s.error_message();
  const std::string where =
      o.server_from.empty()
          ? "the default; --server or PTCTL_SERVER names another"
          : o.server_from;
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      if (absl::StrContains(m, "Connection refused")) {
        return absl::StrCat("no ptcoord at ", o.server,
                            " (connection refused) — is it running? (", where,
                            ")");
      }
      if (absl::StrContains(m, "DNS resolution failed")) {
        return absl::StrCat("cannot resolve the host of ", o.server, " (",
                            where, "): ", m);
      }
      if (o.tls_ca.empty() && !absl::StrContains(m, "Timeout") &&
          SpeaksTls(o.server)) {
        return absl::StrCat(
            "ptcoord at ", o.server,
            " serves TLS and ptctl talked plain text: give the CA that signed "
            "its certificate with --tls-ca (or PTCTL_TLS_CA)");
      }
      if (!o.tls_ca.empty() && absl::StrContains(m, "wrong version number")) {
        return absl::StrCat("ptcoord at ", o.server,
                            " talks plain text, not TLS: drop ", o.tls_ca_from);
      }
      return m;
    case grpc::StatusCode::UNAUTHENTICATED:
      if (absl::StrContains(m, "client certificate")) return m;
      if (o.token.empty()) {
        return absl::StrCat(
            m,
            ": ptctl sent no token; give one with --token or PTCTL_TOKEN: a "
            "line of ptcoord's --token-file, or, for a ptcoord started "
            "without one, its STATE_DIR/user-token");
      }
      return absl::StrCat(m, ": the token of ", o.token_from,
                          " is not one of ptcoord's (a line of its "
                          "--token-file, or its STATE_DIR/user-token)");
    default:
      return m;
  }
}

// Prints a failed call and returns ptctl's exit code for it: 2 when ptcoord
// refused the request as bad input (INVALID_ARGUMENT: a path outside the
// data roots, more ranks than slots), as for bad input found here; else 1.
int RpcError(const Options& o, const grpc::Status& s) {
  std::fprintf(stderr, "ptctl: error: %s: %s\n", CodeName(s.error_code()),
               Explained(o, s).c_str());
  return s.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitBadInput
                                                              : kExitFailed;
}

void PrintJobsTable(const std::vector<ptrain::v1::Job>& jobs) {
  std::printf("%-10s %-24s %-11s %8s %13s %9s %8s\n", "ID", "NAME", "STATE",
              "ATTEMPTS", "STEP", "LOSS", "AGE");
  for (const ptrain::v1::Job& j : jobs) {
    const auto& p = j.progress();
    std::printf("%-10s %-24s %-11s %8d %13s %s %8s\n", j.id().c_str(),
                j.name().c_str(), StateName(j.state()).c_str(), j.attempts(),
                absl::StrCat(p.step(), "/", p.total_steps()).c_str(),
                PadLeft(Figure(HasSteps(p), p.loss()), 9).c_str(),
                Ago(j.created_unix_ms()).c_str());
  }
}

// Renders one line of progress: bar, step/total, loss, tok/s, ETA.
class ProgressBar {
 public:
  void Update(const ptrain::v1::Job& j) {
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
  bool line_due(int64_t step, int64_t total, ptrain::v1::JobState state) {
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
  ptrain::v1::JobState last_state_ = ptrain::v1::JOB_STATE_UNSPECIFIED;
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

int Watch(Client& client, const std::string& id) {
  ExplainInterruptFor(id);
  ProgressBar bar;
  std::string last_message;
  bool connected = false;
  auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (true) {
    auto ctx = client.Context(/*unary=*/false);
    ptrain::v1::WatchJobRequest req;
    req.set_job_id(id);
    auto reader = client.stub().WatchJob(ctx.get(), req);
    ptrain::v1::JobEvent ev;
    std::optional<ptrain::v1::Job> last;
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
      if (!last->error().empty() &&
          last->state() != ptrain::v1::JOB_STATE_SUCCEEDED) {
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

int Submit(Client& client, const std::string& file,
           const std::vector<std::string>& sets, bool watch) {
  // The same bounded reader and parser as ptworker's: a huge file or
  // /dev/zero is refused here, before anything reaches the coordinator.
  absl::StatusOr<std::string> text = ptrain::ReadJobSpecFile(file);
  if (!text.ok()) {
    std::fprintf(stderr, "ptctl: error: %s\n",
                 std::string(text.status().message()).c_str());
    return kExitBadInput;
  }
  absl::StatusOr<ptrain::v1::JobSpec> spec =
      ptrain::ParseJobSpec(*text, sets, file);
  if (!spec.ok()) {
    std::fprintf(stderr, "ptctl: error: %s\n",
                 std::string(spec.status().message()).c_str());
    return kExitBadInput;
  }
  for (const std::string& w : ptrain::JobSpecWarnings(*spec)) {
    std::fprintf(stderr, "ptctl: warning: %s\n", w.c_str());
  }
  ptrain::v1::SubmitJobRequest req;
  req.set_spec_yaml(*text);
  for (const std::string& s : sets) req.add_overrides(s);
  ptrain::v1::SubmitJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().SubmitJob(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ToJson(resp.job()).c_str());
  } else {
    std::printf("%s\n", resp.job().id().c_str());
  }
  std::fflush(stdout);
  return watch ? Watch(client, resp.job().id()) : 0;
}

// What a job not yet ended is on its way to while its attempt ends:
// "cancelling", "pausing", or "".
std::string Ending(const ptrain::v1::Job& job) {
  if (job.cancel_requested() && !IsFinal(job.state())) return "cancelling";
  if (job.pause_requested()) return "pausing";
  return "";
}

int Get(Client& client, const std::string& id) {
  ptrain::v1::GetJobRequest req;
  req.set_job_id(id);
  req.set_include_loss_history(client.options().output == "json");
  ptrain::v1::GetJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().GetJob(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ToJson(resp).c_str());
    return 0;
  }
  const auto& j = resp.job();
  const auto& p = j.progress();
  const std::string ending = Ending(j);
  std::printf(
      "id:        %s\nname:      %s\nstate:     %s%s\nattempts:  %d\nslots:    "
      " %d\n",
      j.id().c_str(), j.name().c_str(), StateName(j.state()).c_str(),
      ending.empty() ? "" : (" (" + ending + ")").c_str(), j.attempts(),
      j.world_size());
  std::printf(
      "step:      %lld/%lld\nloss:      %s\nval_loss:  %s\ntok/s:     %s\n",
      static_cast<long long>(p.step()), static_cast<long long>(p.total_steps()),
      Figure(HasSteps(p), p.loss()).c_str(),
      Figure(p.has_val_loss(), p.val_loss()).c_str(),
      Figure(HasSteps(p), p.tok_per_s(), 0).c_str());
  std::printf("uid:       %s\n", j.uid().c_str());
  if (j.dp() != 0 && j.dp() != j.spec().parallel().dp()) {
    std::printf("layout:    shrunk to dp=%d (spec dp=%d)\n", j.dp(),
                j.spec().parallel().dp());
  }
  if (j.placement_size() > 0) {
    std::vector<std::string> where;
    for (const auto& n : j.placement()) {
      where.push_back(absl::StrCat(
          n.node(), " (", n.ranks(),
          n.gpus().empty()
              ? ""
              : absl::StrCat("; GPUs ", absl::StrJoin(n.gpus(), ",")),
          ")"));
    }
    std::printf("nodes:     %s\n", absl::StrJoin(where, ", ").c_str());
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

// `limit`: the newest N (0: all); `state`: a JobState name without its
// prefix, any case ("" = every state).
int List(Client& client, int limit, const std::string& state) {
  ptrain::v1::ListJobsRequest req;
  req.set_limit(limit);
  if (!state.empty()) {  // one of the names --state's check allows
    ptrain::v1::JobState s = ptrain::v1::JOB_STATE_UNSPECIFIED;
    ptrain::v1::JobState_Parse("JOB_STATE_" + absl::AsciiStrToUpper(state), &s);
    req.set_state(s);
  }
  ptrain::v1::ListJobsResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ListJobs(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ToJson(resp).c_str());
  } else {
    PrintJobsTable({resp.jobs().begin(), resp.jobs().end()});
  }
  return 0;
}

// "ID STATE", or what the job is on its way to while the attempt ends.
void PrintJobState(Client& client, const ptrain::v1::Job& job) {
  if (client.options().output == "json") {
    std::printf("%s\n", ToJson(job).c_str());
    return;
  }
  const std::string ending = Ending(job);
  std::printf("%s %s\n", job.id().c_str(),
              ending.empty() ? StateName(job.state()).c_str() : ending.c_str());
}

int Cancel(Client& client, const std::string& id) {
  ptrain::v1::CancelJobRequest req;
  req.set_job_id(id);
  ptrain::v1::CancelJobResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().CancelJob(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  PrintJobState(client, resp.job());
  return 0;
}

// `pause` (running: save, stop and wait for `resume`) or `resume`.
int PauseOrResume(Client& client, const std::string& id, bool pause) {
  ptrain::v1::Job job;
  auto ctx = client.Context();
  grpc::Status s;
  if (pause) {
    ptrain::v1::PauseJobRequest req;
    req.set_job_id(id);
    ptrain::v1::PauseJobResponse resp;
    s = client.stub().PauseJob(ctx.get(), req, &resp);
    job = resp.job();
  } else {
    ptrain::v1::ResumeJobRequest req;
    req.set_job_id(id);
    ptrain::v1::ResumeJobResponse resp;
    s = client.stub().ResumeJob(ctx.get(), req, &resp);
    job = resp.job();
  }
  if (!s.ok()) return RpcError(client.options(), s);
  PrintJobState(client, job);
  return 0;
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

// `rank` < 0: every line; else only that rank's (whole lines, so each
// stream keeps its unfinished last line until the rest arrives).
int Logs(Client& client, const std::string& id, bool follow, int attempt,
         int rank) {
  ptrain::v1::StreamLogsRequest req;
  req.set_job_id(id);
  req.set_follow(follow);
  req.set_attempt(attempt);
  auto ctx = client.Context(/*unary=*/false);
  auto reader = client.stub().StreamLogs(ctx.get(), req);
  ptrain::v1::LogChunk chunk;
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
  ptrain::v1::ListCheckpointsRequest req;
  req.set_job_id(id);
  ptrain::v1::ListCheckpointsResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ListCheckpoints(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ToJson(resp).c_str());
    return 0;
  }
  std::printf("%10s %8s  %s\n", "STEP", "ATTEMPT", "DIR");
  for (const auto& c : resp.checkpoints()) {
    std::printf("%10lld %8d  %s\n", static_cast<long long>(c.step()),
                c.attempt(), c.dir().c_str());
  }
  return 0;
}

const char* NodeStateName(ptrain::v1::NodeState s) {
  switch (s) {
    case ptrain::v1::NODE_STATE_UP:
      return "UP";
    case ptrain::v1::NODE_STATE_DOWN:
      return "DOWN";
    default:
      return "?";
  }
}

int Nodes(Client& client) {
  ptrain::v1::ListNodesResponse resp;
  auto ctx = client.Context();
  const grpc::Status s =
      client.stub().ListNodes(ctx.get(), ptrain::v1::ListNodesRequest(), &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ToJson(resp).c_str());
    return 0;
  }
  const int64_t now = absl::ToUnixMillis(absl::Now());
  std::printf("%-20s %-24s %9s %6s %5s %-14s %14s %6s\n", "NAME", "ADDRESS",
              "SLOTS", "CORES", "GPUS", "STATE", "HEARTBEAT", "LOAD");
  for (const auto& n : resp.nodes()) {
    const std::string beat =
        n.last_heartbeat_unix_ms() == 0
            ? "never"
            : absl::StrFormat("%.1f s ago",
                              (now - n.last_heartbeat_unix_ms()) / 1e3);
    const std::string slots =
        absl::StrCat(n.slots_used(), "/", n.spec().slots());
    const std::string state =
        absl::StrCat(NodeStateName(n.state()), n.draining() ? ",DRAINING" : "");
    std::printf("%-20s %-24s %9s %6d %5d %-14s %14s %6.2f\n",
                n.spec().name().c_str(), n.spec().address().c_str(),
                slots.c_str(), n.spec().cores(), n.spec().gpus(), state.c_str(),
                beat.c_str(), n.load1());
  }
  // A registration refused for a node's name is someone else claiming it
  // (or the node itself, reinstalled without its secret): say so.
  for (const auto& n : resp.nodes()) {
    if (n.refused_registrations() == 0) continue;
    std::printf(
        "note: %s: %d registration(s) refused for its name (no or a wrong "
        "node secret), the last %s ago from %s\n",
        n.spec().name().c_str(), n.refused_registrations(),
        absl::FormatDuration(
            absl::Trunc(absl::Milliseconds(now - n.last_refused_unix_ms()),
                        absl::Seconds(1)))
            .c_str(),
        n.last_refused_peer().c_str());
  }
  return 0;
}

// ptctl forget-node NODE.
int ForgetNode(Client& client, const std::string& node) {
  ptrain::v1::ForgetNodeRequest req;
  req.set_name(node);
  ptrain::v1::ForgetNodeResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().ForgetNode(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  std::printf(
      "%s forgotten: the next daemon that registers this name is bound to it "
      "with a new node secret\n",
      node.c_str());
  return 0;
}

// ptctl drain NODE / uncordon NODE.
int Drain(Client& client, const std::string& node, bool drain) {
  ptrain::v1::DrainNodeRequest req;
  req.set_name(node);
  req.set_drain(drain);
  ptrain::v1::DrainNodeResponse resp;
  auto ctx = client.Context();
  const grpc::Status s = client.stub().DrainNode(ctx.get(), req, &resp);
  if (!s.ok()) return RpcError(client.options(), s);
  if (client.options().output == "json") {
    std::printf("%s\n", ToJson(resp.node()).c_str());
    return 0;
  }
  std::printf("%s %s\n", node.c_str(),
              drain ? "drained: no new attempts start on it"
                    : "uncordoned: attempts may start on it");
  return 0;
}

int Run(int argc, char** argv) {
  // ptctl says what failed itself, in one line; gRPC's own log lines (a
  // failed TLS handshake) would repeat it in gRPC's terms. A
  // GRPC_VERBOSITY the user set still wins.
  setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  CLI::App app{"ptctl: submit and manage ptrain jobs on a ptcoord"};
  app.require_subcommand(1);
  // --server, --token and -o may also follow the subcommand.
  app.fallthrough();
  Options o;
  if (const char* s = std::getenv("PTCTL_SERVER")) {
    o.server = s;
    o.server_from = "PTCTL_SERVER";
  }
  if (const char* t = std::getenv("PTCTL_TOKEN")) o.token = t;
  app.add_option("--server", o.server,
                 absl::StrCat("ptcoord address host:port (or PTCTL_SERVER; "
                              "default ",
                              kDefaultServer, ")"));
  app.add_option("--token", o.token,
                 "bearer token (or PTCTL_TOKEN): a line of ptcoord's "
                 "--token-file, or its STATE_DIR/user-token");
  app.add_option("-o,--output", o.output, "table|json")
      ->check(CLI::IsMember({"table", "json"}));
  if (const char* v = std::getenv("PTCTL_TLS_CA")) o.tls_ca = v;
  if (const char* v = std::getenv("PTCTL_TLS_CERT")) o.tls_cert = v;
  if (const char* v = std::getenv("PTCTL_TLS_KEY")) o.tls_key = v;
  app.add_option("--tls-ca", o.tls_ca,
                 "talk TLS, trusting this CA for ptcoord's certificate (or "
                 "PTCTL_TLS_CA)");
  app.add_option("--tls-cert", o.tls_cert,
                 "client certificate for a ptcoord with --tls-client-ca (or "
                 "PTCTL_TLS_CERT)");
  app.add_option("--tls-key", o.tls_key,
                 "the key of --tls-cert (or PTCTL_TLS_KEY)");

  std::string file, job;
  std::vector<std::string> sets;
  bool watch = false, follow = false;
  int attempt = 0;
  auto* submit = app.add_subcommand("submit", "submit a job spec (YAML)");
  submit->add_option("FILE", file, "job spec")->required();
  submit->add_option("--set", sets,
                     "override a field: dotted.path=value (repeatable)");
  submit->add_flag("--watch", watch,
                   "follow the job; exit 0 only if it SUCCEEDED");
  auto* get = app.add_subcommand("get", "show one job");
  get->add_option("JOB", job)->required();
  auto* list = app.add_subcommand("list", "list jobs");
  int list_limit = 0;
  std::string list_state;
  list->add_option("--limit", list_limit, "only the newest N jobs (0: all)")
      ->check(CLI::Range(0, 10000));
  list->add_option("--state", list_state, "only jobs in this state")
      ->check(CLI::IsMember(StateFlagNames(), CLI::ignore_case));
  auto* logs = app.add_subcommand("logs", "print an attempt's output");
  logs->add_option("JOB", job)->required();
  logs->add_flag("-f,--follow", follow, "keep printing until the attempt ends");
  int rank = -1;
  logs->add_option("--rank", rank, "only the lines of this rank")
      ->check(CLI::Range(0, 1 << 20));
  logs->add_option("--attempt", attempt, "attempt number (default: the latest)")
      ->check(CLI::NonNegativeNumber);
  auto* cancel = app.add_subcommand("cancel", "cancel a job (idempotent)");
  cancel->add_option("JOB", job)->required();
  auto* pause = app.add_subcommand(
      "pause",
      "stop a job until `resume`: a running one saves a checkpoint of the "
      "step it is in first (idempotent)");
  pause->add_option("JOB", job)->required();
  auto* resume = app.add_subcommand(
      "resume", "queue a paused job again; it goes on from its checkpoint");
  resume->add_option("JOB", job)->required();
  auto* watch_cmd = app.add_subcommand("watch", "follow a job until it ends");
  watch_cmd->add_option("JOB", job)->required();
  auto* ckpts = app.add_subcommand("checkpoints", "list a job's checkpoints");
  ckpts->add_option("JOB", job)->required();
  auto* nodes = app.add_subcommand("nodes", "list the cluster's nodes");
  std::string node;
  auto* drain = app.add_subcommand(
      "drain", "take a node out of scheduling (running jobs stay)");
  drain->add_option("NODE", node, "node name")->required();
  auto* uncordon =
      app.add_subcommand("uncordon", "let jobs start on a node again");
  uncordon->add_option("NODE", node, "node name")->required();
  auto* forget = app.add_subcommand(
      "forget-node",
      "forget a node that is down and idle (reinstalled, retired): its name "
      "may register afresh");
  forget->add_option("NODE", node, "node name")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitBadInput;
  }
  const auto from = [&app](const char* flag, const char* env) {
    return std::string(app.count(flag) > 0 ? flag : env);
  };
  if (app.count("--server") > 0) o.server_from = "--server";
  o.token_from = from("--token", "PTCTL_TOKEN");
  o.tls_ca_from = from("--tls-ca", "PTCTL_TLS_CA");
  o.tls_cert_from = from("--tls-cert", "PTCTL_TLS_CERT");
  o.tls_key_from = from("--tls-key", "PTCTL_TLS_KEY");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(o);
  if (!channel.ok()) {
    std::fprintf(stderr, "ptctl: error: %s\n",
                 std::string(channel.status().message()).c_str());
    return kExitBadInput;
  }
  Client client(o, *channel);
  if (*submit) return Submit(client, file, sets, watch);
  if (*get) return Get(client, job);
  if (*list) return List(client, list_limit, list_state);
  if (*logs) return Logs(client, job, follow, attempt, rank);
  if (*cancel) return Cancel(client, job);
  if (*pause) return PauseOrResume(client, job, true);
  if (*resume) return PauseOrResume(client, job, false);
  if (*watch_cmd) return Watch(client, job);
  if (*ckpts) return Checkpoints(client, job);
  if (*nodes) return Nodes(client);
  if (*drain) return Drain(client, node, true);
  if (*uncordon) return Drain(client, node, false);
  if (*forget) return ForgetNode(client, node);
  return kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
