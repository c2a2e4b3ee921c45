// A rank's /metrics page: the DESIGN.md §7 names, the rank's labels, and the
// values the trainer last reported, fetched over HTTP as Prometheus does.
#include "worker/engine/report/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ctime>
#include <string>
#include <vector>

namespace ptrain {
namespace {

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req =
      "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

TEST(RankMetrics, PageCarriesDesignNamesLabelsAndLastValues) {
  auto m = RankMetrics::Start(
      "127.0.0.1:0",
      {"shakespeare", "node7", 3, {{"dp", 1}, {"tp", 1}, {"pp", 0}}});
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_GT((*m)->port(), 0);
  (*m)->OnStep(12, 2.5, 0.2, 1234.0, 0.4, {0.01, 0.05, 0.1, 0.02});
  (*m)->OnStep(13, 2.25, 0.2, 1500.0, 0.45, {0.01, 0.05, 0.1, 0.02});
  (*m)->OnEval(2.75);
  (*m)->OnCheckpoint(0.5);
  (*m)->SetMemory({100, 200, 300, 400});
  CommStats stats;
  stats.Record("dp", CommOp::kAllReduce, 0.125, 4096);
  stats.RecordExposed(0.5);
  (*m)->UpdateComm(stats);
  stats.Record("dp", CommOp::kAllReduce, 0.125, 4096);
  stats.RecordExposed(0.25);
  (*m)->UpdateComm(stats);  // counters advance by the difference only
  (*m)->OnAnomaly("spike");
  (*m)->OnAnomaly("spike");

  const std::string page = HttpGet((*m)->port(), "/metrics");
  const std::string labels =
      "dp_rank=\"1\",job=\"shakespeare\",node=\"node7\",pp_rank=\"0\","
      "rank=\"3\",tp_rank=\"1\"";
  for (const std::string& line : std::vector<std::string>{
           "ptrain_step{" + labels + "} 13",
           "ptrain_train_loss{" + labels + "} 2.25",
           "ptrain_val_loss{" + labels + "} 2.75",
           "ptrain_tokens_per_second{" + labels + "} 1500",
           "ptrain_mfu_ratio{" + labels + "} 0.45",
           "ptrain_step_seconds_count{" + labels + "} 2",
           "ptrain_checkpoint_seconds_count{" + labels + "} 1",
           "ptrain_memory_bytes{dp_rank=\"1\",job=\"shakespeare\",kind="
           "\"grads\",node=\"node7\",pp_rank=\"0\",rank=\"3\",tp_rank=\"1\"} "
           "200",
           "ptrain_phase_seconds_total{dp_rank=\"1\",job=\"shakespeare\",node="
           "\"node7\",phase=\"backward\",pp_rank=\"0\",rank=\"3\",tp_rank="
           "\"1\"} 0.2",
           "ptrain_comm_bytes_total{dp_rank=\"1\",group=\"dp\",job="
           "\"shakespeare\","
           "node=\"node7\",op=\"all_reduce\",pp_rank=\"0\",rank=\"3\","
           "tp_rank=\"1\"} 8192",
           "ptrain_comm_seconds_total{dp_rank=\"1\",group=\"dp\",job="
           "\"shakespeare\",node=\"node7\",op=\"all_reduce\",pp_rank=\"0\","
           "rank=\"3\",tp_rank=\"1\"} 0.25",
           "ptrain_comm_exposed_seconds_total{" + labels + "} 0.75",
           "ptrain_anomalies_total{dp_rank=\"1\",job=\"shakespeare\",kind="
           "\"spike\",node=\"node7\",pp_rank=\"0\",rank=\"3\",tp_rank="
           "\"1\"} 2",
           "ptrain_anomalies_total{dp_rank=\"1\",job=\"shakespeare\",kind="
           "\"nan\",node=\"node7\",pp_rank=\"0\",rank=\"3\",tp_rank="
           "\"1\"} 0",
       }) {
    EXPECT_NE(page.find(line), std::string::npos) << line << "\n" << page;
  }
  // Checkpoint age: absent until the job's policy is known; then the last
  // save's time, the start of training before the first.
  EXPECT_EQ(page.find("ptrain_checkpoint_every_steps{"), std::string::npos);
  EXPECT_EQ(page.find("ptrain_last_checkpoint_timestamp_seconds{"),
            std::string::npos);
  const double before = static_cast<double>(std::time(nullptr));
  (*m)->OnCheckpointPolicy(250);
  const std::string ck_page = HttpGet((*m)->port(), "/metrics");
  EXPECT_NE(ck_page.find("ptrain_checkpoint_every_steps{" + labels + "} 250"),
            std::string::npos)
      << ck_page;
  const std::string last =
      "ptrain_last_checkpoint_timestamp_seconds{" + labels + "} ";
  const size_t at = ck_page.find(last);
  ASSERT_NE(at, std::string::npos) << ck_page;
  const double when = std::stod(ck_page.substr(at + last.size()));
  EXPECT_GE(when, before);
  EXPECT_LE(when, before + 60);
  // A cpu rank has no GPU memory series; a GPU rank's appear with its
  // first value.
  EXPECT_EQ(page.find("ptrain_gpu_memory_bytes{"), std::string::npos) << page;
  (*m)->SetGpuMemory(int64_t{3} << 30, int64_t{80} << 30);
  const std::string gpu_page = HttpGet((*m)->port(), "/metrics");
  for (const std::string& line : std::vector<std::string>{
           "ptrain_gpu_memory_bytes{dp_rank=\"1\",job=\"shakespeare\",kind="
           "\"used\",node=\"node7\",pp_rank=\"0\",rank=\"3\",tp_rank="
           "\"1\"} 3221225472",
           "ptrain_gpu_memory_bytes{dp_rank=\"1\",job=\"shakespeare\",kind="
           "\"total\",node=\"node7\",pp_rank=\"0\",rank=\"3\",tp_rank="
           "\"1\"} 85899345920",
       }) {
    EXPECT_NE(gpu_page.find(line), std::string::npos) << line << "\n"
                                                      << gpu_page;
  }
}

// A rank of a context-parallel job carries its cp coordinate as a label,
// and its ring's traffic is group="cp"; other jobs' series have no cp_rank
// (the page above).
// A Mixture-of-Experts step: tokens per layer and expert, the imbalance,
// the dropped choices (counted up), the balance loss.
TEST(RankMetrics, ExpertLoadIsOnThePageByLayerAndExpert) {
  auto m = RankMetrics::Start("127.0.0.1:0", {"moe", "node1", 0, {}});
  ASSERT_TRUE(m.ok()) << m.status();
  ExpertLoad load;
  load.layers.push_back({0, {30, 10, 20, 20}, 5});
  load.layers.push_back({1, {20, 20, 20, 20}, 0});
  load.aux_loss = 0.0125;
  (*m)->OnExperts(load);
  load.layers[0].dropped = 2;
  (*m)->OnExperts(load);
  const std::string page = HttpGet((*m)->port(), "/metrics");
  for (const std::string& line : std::vector<std::string>{
           "ptrain_moe_expert_tokens{expert=\"0\",job=\"moe\",layer=\"0\","
           "node=\"node1\",rank=\"0\"} 30",
           "ptrain_moe_expert_tokens{expert=\"3\",job=\"moe\",layer=\"1\","
           "node=\"node1\",rank=\"0\"} 20",
           "ptrain_moe_imbalance_ratio{job=\"moe\",layer=\"0\",node=\"node1\","
           "rank=\"0\"} 1.5",
           "ptrain_moe_imbalance_ratio{job=\"moe\",layer=\"1\",node=\"node1\","
           "rank=\"0\"} 1",
           "ptrain_moe_dropped_total{job=\"moe\",layer=\"0\",node=\"node1\","
           "rank=\"0\"} 7",
           "ptrain_moe_aux_loss{job=\"moe\",node=\"node1\",rank=\"0\"} "
           "0.0125",
       }) {
    EXPECT_NE(page.find(line + "\n"), std::string::npos) << line << "\n"
                                                         << page;
  }
}

TEST(RankMetrics, ContextParallelRanksCarryTheirCpRankAndGroup) {
  RankLabels labels{
      "long", "node2", 5, {{"dp", 0}, {"tp", 1}, {"pp", 0}, {"cp", 1}}};
  auto m = RankMetrics::Start("127.0.0.1:0", labels);
  ASSERT_TRUE(m.ok()) << m.status();
  CommStats stats;
  stats.Record("cp", CommOp::kSend, 0.5, 1024);
  stats.Record("cp", CommOp::kRecv, 0.25, 1024);
  (*m)->UpdateComm(stats);
  const std::string page = HttpGet((*m)->port(), "/metrics");
  for (const std::string& line : std::vector<std::string>{
           "ptrain_comm_seconds_total{cp_rank=\"1\",dp_rank=\"0\",group="
           "\"cp\",job=\"long\",node=\"node2\",op=\"send\",pp_rank=\"0\","
           "rank=\"5\",tp_rank=\"1\"} 0.5",
           "ptrain_comm_bytes_total{cp_rank=\"1\",dp_rank=\"0\",group="
           "\"cp\",job=\"long\",node=\"node2\",op=\"recv\",pp_rank=\"0\","
           "rank=\"5\",tp_rank=\"1\"} 1024",
       }) {
    EXPECT_NE(page.find(line), std::string::npos) << line << "\n" << page;
  }
}

TEST(RankMetrics, AddressInUseIsAClearError) {
  auto a = RankMetrics::Start("127.0.0.1:0", {"j", "n", 0, {}});
  ASSERT_TRUE(a.ok());
  auto b = RankMetrics::Start("127.0.0.1:" + std::to_string((*a)->port()),
                              {"j", "n", 1, {}});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("--metrics-bind"), std::string::npos);
}

}  // namespace
}  // namespace ptrain
