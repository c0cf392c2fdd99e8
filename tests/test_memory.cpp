// When a run asks glibc for huge pages (core/memory.h): not where the kernel
// reports free pages to its host, since huge pages are cut from exactly the
// blocks it has handed back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "harness/core/memory.h"

namespace {

namespace fs = std::filesystem;

// A balloon driver's sysfs directory with one device per entry of `features`.
class FakeBalloon : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dc_balloon_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void device(const std::string& name, const std::string& features) {
    fs::create_directories(dir_ / name);
    std::ofstream(dir_ / name / "features") << features << "\n";
  }
  fs::path dir_;
};

// This VM's balloon: bits 1, 2, 5 and 7, then VIRTIO_F_VERSION_1 (bit 32).
const std::string kReporting = "0110010100000000000000000000000010000000000000000000000000000000";
const std::string kNoReporting = "0110000100000000000000000000000010000000000000000000000000000000";

TEST_F(FakeBalloon, ReportingIsFeatureBitFive) {
  device("virtio0", kReporting);
  EXPECT_TRUE(dc::free_pages_reported_to_host(dir_.string()));
}

TEST_F(FakeBalloon, ABalloonWithoutReportingKeepsFreeMemory) {
  device("virtio0", kNoReporting);
  EXPECT_FALSE(dc::free_pages_reported_to_host(dir_.string()));
  device("virtio3", kReporting);  // any reporting device counts
  EXPECT_TRUE(dc::free_pages_reported_to_host(dir_.string()));
}

TEST_F(FakeBalloon, NoBalloonNoReporting) {
  EXPECT_FALSE(dc::free_pages_reported_to_host(dir_.string()));
  EXPECT_FALSE(dc::free_pages_reported_to_host((dir_ / "absent").string()));
  device("virtio0", "0110");  // a features string too short to say
  EXPECT_FALSE(dc::free_pages_reported_to_host(dir_.string()));
}

TEST(HugePages, TheEnvironmentDecidesWhenSet) {
  const char* old = std::getenv("DIFFCHECK_HUGEPAGES");
  const std::string saved = old ? old : "";
  setenv("DIFFCHECK_HUGEPAGES", "0", 1);
  EXPECT_FALSE(dc::want_huge_pages());
  setenv("DIFFCHECK_HUGEPAGES", "1", 1);
  EXPECT_TRUE(dc::want_huge_pages());
  unsetenv("DIFFCHECK_HUGEPAGES");
  EXPECT_EQ(dc::want_huge_pages(), !dc::free_pages_reported_to_host("/sys/bus/virtio/drivers/virtio_balloon"));
  if (old) setenv("DIFFCHECK_HUGEPAGES", saved.c_str(), 1);
}

}  // namespace
