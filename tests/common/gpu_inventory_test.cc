// The GPU inventory ptcoord and ptworkerd count without CUDA: the driver's
// folders, narrowed by CUDA_VISIBLE_DEVICES as the CUDA runtime narrows them.
#include "common/gpu_inventory.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace ptrain {
namespace {

GpuListing Gpus(std::vector<std::string> uuids) {
  GpuListing l;
  l.driver = true;
  l.uuids = std::move(uuids);
  return l;
}

TEST(GpuInventoryTest, ListsOneGpuPerDriverFolderWithItsUuid) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("gpus_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "0000:41:00.0");
  std::filesystem::create_directories(dir / "0000:01:00.0");
  std::ofstream(dir / "0000:01:00.0" / "information")
      << "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-aaaa-1111\nBus Type: "
         "PCIe\n";
  const GpuListing l = ListGpus(dir.string());
  EXPECT_TRUE(l.driver);
  EXPECT_EQ(l.uuids, (std::vector<std::string>{"GPU-aaaa-1111", ""}));
  std::filesystem::remove_all(dir);
  const GpuListing none = ListGpus(dir.string());
  EXPECT_FALSE(none.driver);
  EXPECT_TRUE(none.uuids.empty());
  EXPECT_NE(NoGpuReason(none, std::nullopt).find("no NVIDIA driver"),
            std::string::npos);
}

TEST(GpuInventoryTest, CudaVisibleDevicesNarrowsAsTheRuntimeDoes) {
  const GpuListing four = Gpus({"GPU-a1", "GPU-b2", "GPU-c3", "GPU-d4"});
  EXPECT_EQ(VisibleGpus(four, std::nullopt), 4);
  EXPECT_EQ(VisibleGpus(four, ""), 0);
  EXPECT_EQ(VisibleGpus(four, "2"), 1);
  EXPECT_EQ(VisibleGpus(four, "0,3"), 2);
  EXPECT_EQ(VisibleGpus(four, " 1 , 2 "), 2);
  // The first entry that names no GPU, or one named before, ends the list;
  // an index given twice hides them all.
  EXPECT_EQ(VisibleGpus(four, "1,7,2"), 1);
  EXPECT_EQ(VisibleGpus(four, "1,-1,2"), 1);
  EXPECT_EQ(VisibleGpus(four, "x"), 0);
  EXPECT_EQ(VisibleGpus(four, "GPU-c3,2"), 1);
  EXPECT_EQ(VisibleGpus(four, "1,1,2"), 0);
  // UUIDs and the prefixes that name one GPU; MIG devices count one each.
  EXPECT_EQ(VisibleGpus(four, "GPU-c,GPU-a1"), 2);
  EXPECT_EQ(VisibleGpus(four, "GPU-zz,0"), 0);
  EXPECT_EQ(VisibleGpus(four, "GPU-"), 0);
  EXPECT_EQ(VisibleGpus(Gpus({"GPU-ab1", "GPU-ab2"}), "GPU-ab"), 0);
  EXPECT_EQ(VisibleGpus(four, "MIG-1,MIG-2"), 2);
  EXPECT_EQ(VisibleGpus(Gpus({}), "0"), 0);
}

TEST(GpuInventoryTest, ReasonSaysWhyNoGpuIsSeen) {
  EXPECT_EQ(NoGpuReason(Gpus({"GPU-a"}), std::nullopt), "");
  EXPECT_NE(NoGpuReason(Gpus({}), std::nullopt).find("shows no GPU"),
            std::string::npos);
  EXPECT_EQ(NoGpuReason(Gpus({"GPU-a", "GPU-b"}), "5"),
            "CUDA_VISIBLE_DEVICES=5 names none of this host's 2 GPU(s)");
}

}  // namespace
}  // namespace ptrain
