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
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/node.grpc.pb.h"

namespace {

constexpr int kFailed = 255;

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
  std::ifstream in(nodes_file);
  if (!in) return Fail(std::string("cannot read ") + nodes_file);
  std::string address, line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name, addr;
    if (fields >> name >> addr && name == node) address = addr;
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
  return Run(argc, argv);
}
