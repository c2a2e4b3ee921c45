// Fuzzes the checks ptcoord applies to what ranks send it
// (coordinator/reports.h): RankService requests built field by field or
// parsed from wire bytes, run-log lines and host:port addresses. Not the RPC
// server, not the store. Input: one byte picks the target, the rest feeds it.
// Whatever the bytes, a check returns OK or an error that says why, and
// whatever it accepts obeys the documented rules (else abort).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "coordinator/reports.h"

namespace {

using ptrain::ReportContext;

void Require(bool property) {
  if (!property) std::abort();
}

// A refusal names its field: a non-empty message.
void RequireReason(const absl::Status& s) {
  Require(s.ok() || (s.code() == absl::StatusCode::kInvalidArgument &&
                     !s.message().empty()));
}

// Any double, NaN and infinities included.
double AnyDouble(FuzzedDataProvider& in) {
  const uint64_t bits = in.ConsumeIntegral<uint64_t>();
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
}

bool Figure(double v) { return std::isfinite(v) && v >= 0; }

void CheckProgress(const ptrain::v1::ReportProgressRequest& r,
                   const ReportContext& ctx) {
  const absl::Status s = ptrain::ValidateProgress(r, ctx);
  RequireReason(s);
  if (!s.ok()) return;
  Require(r.job_id() == ctx.job_id && r.attempt() == ctx.attempt);
  Require(r.rank() >= 0 && r.rank() < ctx.world_size);
  Require(r.step() >= 0 && r.step() <= ctx.total_steps);
  Require(Figure(r.loss()) && Figure(r.val_loss()) && Figure(r.tok_per_s()) &&
          Figure(r.mfu()) && Figure(r.lr()));
}

void CheckCheckpoint(const ptrain::v1::ReportCheckpointRequest& r,
                     const ReportContext& ctx) {
  const absl::Status s = ptrain::ValidateCheckpoint(r, ctx);
  RequireReason(s);
  if (!s.ok()) return;
  Require(r.job_id() == ctx.job_id && r.attempt() == ctx.attempt);
  Require(r.step() >= 0 && r.step() <= ctx.total_steps);
  Require(!r.dir().empty() && r.dir()[0] == '/');
  const std::string name = ptrain::StepFolderName(r.step());
  Require(r.dir().size() >= name.size() &&
          r.dir().compare(r.dir().size() - name.size(), name.size(), name) ==
              0);
}

void CheckHostPort(const std::string& address) {
  const absl::Status s = ptrain::ValidateHostPort("address", address);
  RequireReason(s);
  if (!s.ok()) return;
  const size_t colon = address.rfind(':');
  Require(colon != std::string::npos && colon > 0);
  int port = 0;
  Require(absl::SimpleAtoi(address.substr(colon + 1), &port));
  Require(port >= 1 && port <= 65535);
}

void CheckEndpoint(const ptrain::v1::ReportEndpointRequest& r,
                   const ReportContext& ctx) {
  const absl::Status s = ptrain::ValidateEndpoint(r, ctx);
  RequireReason(s);
  if (!s.ok()) return;
  Require(r.rank() >= 0 && r.rank() < ctx.world_size);
  Require(r.labels_size() <= static_cast<int>(ptrain::kMaxEndpointLabels));
  CheckHostPort(r.address());
}

void CheckRunLogLine(const std::string& line, const ReportContext& ctx) {
  const std::optional<ptrain::RunLogRecord> rec =
      ptrain::ParseRunLogLine(line, ctx);
  if (!rec.has_value()) return;
  Require(rec->step >= 0 && rec->step <= ctx.total_steps);
  Require(Figure(rec->loss) && Figure(rec->val_loss) && Figure(rec->lr) &&
          Figure(rec->tok_per_s) && Figure(rec->mfu));
  if (rec->kind == ptrain::RunLogRecord::kCheckpoint) {
    Require(!rec->dir.empty() && rec->dir[0] == '/');
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const uint8_t target = in.ConsumeIntegral<uint8_t>() % 6;
  ReportContext ctx;
  ctx.job_id = "job-0001";
  ctx.attempt = in.ConsumeIntegralInRange<int>(1, 3);
  ctx.world_size = in.ConsumeIntegralInRange<int>(1, 8);
  ctx.total_steps = in.ConsumeIntegralInRange<int64_t>(0, 1000);
  switch (target) {
    case 0: {  // ReportProgress, field by field
      ptrain::v1::ReportProgressRequest r;
      r.set_job_id(in.ConsumeBool() ? ctx.job_id
                                    : in.ConsumeRandomLengthString(200));
      r.set_attempt(in.ConsumeIntegralInRange<int32_t>(-1, 4));
      r.set_rank(in.ConsumeIntegralInRange<int32_t>(-2, 9));
      r.set_step(in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, 1002)
                                  : in.ConsumeIntegral<int64_t>());
      r.set_is_eval(in.ConsumeBool());
      r.set_loss(AnyDouble(in));
      r.set_val_loss(AnyDouble(in));
      r.set_tok_per_s(AnyDouble(in));
      r.set_mfu(AnyDouble(in));
      r.set_lr(AnyDouble(in));
      CheckProgress(r, ctx);
      break;
    }
    case 1: {  // ReportCheckpoint
      ptrain::v1::ReportCheckpointRequest r;
      r.set_job_id(ctx.job_id);
      r.set_attempt(in.ConsumeIntegralInRange<int32_t>(-1, 4));
      r.set_step(in.ConsumeIntegralInRange<int64_t>(-2, 1002));
      r.set_dir(in.ConsumeRandomLengthString(5000));
      CheckCheckpoint(r, ctx);
      break;
    }
    case 2: {  // ReportEndpoint
      ptrain::v1::ReportEndpointRequest r;
      r.set_job_id(ctx.job_id);
      r.set_attempt(ctx.attempt);
      r.set_rank(in.ConsumeIntegralInRange<int32_t>(-2, 9));
      r.set_address(in.ConsumeRandomLengthString(400));
      const int labels = in.ConsumeIntegralInRange<int>(0, 40);
      for (int i = 0; i < labels && in.remaining_bytes() > 0; ++i) {
        (*r.mutable_labels())[in.ConsumeRandomLengthString(300)] =
            in.ConsumeRandomLengthString(300);
      }
      CheckEndpoint(r, ctx);
      break;
    }
    case 3: {  // a request as wire bytes, whatever the sender put in
      const uint8_t kind = in.ConsumeIntegral<uint8_t>() % 3;
      const std::string bytes = in.ConsumeRemainingBytesAsString();
      if (kind == 0) {
        ptrain::v1::ReportProgressRequest r;
        if (r.ParseFromString(bytes)) CheckProgress(r, ctx);
      } else if (kind == 1) {
        ptrain::v1::ReportCheckpointRequest r;
        if (r.ParseFromString(bytes)) CheckCheckpoint(r, ctx);
      } else {
        ptrain::v1::ReportEndpointRequest r;
        if (r.ParseFromString(bytes)) CheckEndpoint(r, ctx);
      }
      break;
    }
    case 4:  // one line of run.jsonl
      CheckRunLogLine(in.ConsumeRemainingBytesAsString(), ctx);
      break;
    default:  // an address
      CheckHostPort(in.ConsumeRemainingBytesAsString());
      break;
  }
  return 0;
}
