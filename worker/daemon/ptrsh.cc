// ptrsh: OpenMPI's launch agent on a ptrain cluster (mpirun --mca
// plm_rsh_agent ptrsh). OpenMPI runs it as an ssh stand-in:
//
//   ptrsh [ssh options] NODE WORD...
//
// It sends the words, joined by spaces as a remote shell would receive them,
// to NODE's ptworkerd (DaemonService.Exec, authorized by the attempt token
// in PTRAIN_JOB_TOKEN), relays the command's stdout and stderr, and exits
// with its exit code; 255 (as ssh) when the node cannot be reached or
// refuses. Each node's daemon address is a line "NODE HOST:PORT" of the
// file PTRAIN_NODES_FILE, written by ptcoord for the attempt.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/bounded_file.h"
#include "common/header_value.h"
#include "common/thread_entry.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/node.grpc.pb.h"

namespace {

constexpr int kFailed = 255;

// ptcoord writes a line per node of the attempt; a cluster of ten thousand
// nodes fits many times over.
constexpr size_t kMaxNodesFileBytes = size_t{1} << 20;

int Fail(const std::string& message) {
  std::fprintf(stderr, "ptrsh: %s\n", message.c_str());
  return kFailed;
}

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

int Run(int argc, char** argv) {
  // Options OpenMPI may put before the host (plm_rsh_args), as ssh takes
  // them: those with a value, then flags.
  int i = 1;
  while (i < argc && argv[i][0] == '-') {
    const std::string opt = argv[i];
    i += (opt == "-l" || opt == "-p" || opt == "-o" || opt == "-i") ? 2 : 1;
  }
  if (i >= argc) return Fail("usage: ptrsh [ssh options] NODE COMMAND...");
  const std::string node = argv[i++];
  if (i >= argc) return Fail("no command for " + node);
  std::vector<std::string> words(argv + i, argv + argc);

  const char* nodes_file = std::getenv("PTRAIN_NODES_FILE");
  const char* token = std::getenv("PTRAIN_JOB_TOKEN");
  if (nodes_file == nullptr || token == nullptr) {
    return Fail(
        "PTRAIN_NODES_FILE and PTRAIN_JOB_TOKEN must be set (ptcoord sets "
        "them for mpirun)");
  }
  // Before any call: gRPC aborts on a header value it refuses.
  if (absl::Status s = ptrain::CheckHeaderValue("PTRAIN_JOB_TOKEN", token);
      !s.ok()) {
    return Fail(std::string(s.message()));
  }
  absl::StatusOr<std::string> nodes = ptrain::ReadBoundedFile(
      "PTRAIN_NODES_FILE", nodes_file, kMaxNodesFileBytes);
  if (!nodes.ok()) return Fail(std::string(nodes.status().message()));
  std::string address;
  for (absl::string_view line : absl::StrSplit(*nodes, '\n')) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.size() >= 2 && fields[0] == node) {
      address = std::string(fields[1]);
    }
  }
  if (address.empty()) {
    return Fail("node " + node + " is not in " + nodes_file);
  }

  auto stub = ptrain::v1::DaemonService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Bearer ") + token);
  ctx.set_wait_for_ready(false);
  ptrain::v1::ExecRequest req;
  req.set_command(absl::StrJoin(words, " "));
  std::unique_ptr<grpc::ClientReader<ptrain::v1::ExecOutput>> reader =
      stub->Exec(&ctx, req);
  ptrain::v1::ExecOutput msg;
  int exit_code = kFailed;
  bool exited = false;
  while (reader->Read(&msg)) {
    if (!msg.stdout().empty()) WriteAll(1, msg.stdout());
    if (!msg.stderr().empty()) WriteAll(2, msg.stderr());
    if (msg.exited()) {
      exited = true;
      exit_code = msg.exit_code();
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) {
    return Fail("node " + node + " (" + address + "): " + s.error_message());
  }
  if (!exited) return Fail("node " + node + ": no exit code");
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  return ptrain::MainEntry([&] { return Run(argc, argv); });
}
