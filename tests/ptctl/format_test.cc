// ptctl's words for a job's figures: a job whose reports could not all be
// saved, or that succeeded short of its last step, says so.
#include "ptctl/format.h"

#include <gtest/gtest.h>

#include <string>

namespace ptrain::ptctl {
namespace {

v1::Job JobAt(v1::JobState state, int64_t step, int64_t total,
              int64_t unsaved) {
  v1::Job j;
  j.set_state(state);
  j.mutable_progress()->set_step(step);
  j.mutable_progress()->set_total_steps(total);
  j.mutable_progress()->set_unsaved_reports(unsaved);
  return j;
}

TEST(FiguresNote, SaysWhenTheFiguresAreNotTheLastOnes) {
  EXPECT_EQ(FiguresNote(JobAt(v1::JOB_STATE_SUCCEEDED, 1500, 1500, 0)), "");
  EXPECT_EQ(FiguresNote(JobAt(v1::JOB_STATE_RUNNING, 39, 1500, 0)), "");
  const std::string short_end =
      FiguresNote(JobAt(v1::JOB_STATE_SUCCEEDED, 39, 1500, 0));
  EXPECT_NE(short_end.find("incomplete: the newest saved are of step 39"),
            std::string::npos)
      << short_end;
  const std::string gap =
      FiguresNote(JobAt(v1::JOB_STATE_SUCCEEDED, 1500, 1500, 3));
  EXPECT_NE(gap.find("3 progress reports could not be saved"),
            std::string::npos)
      << gap;
  EXPECT_EQ(gap.find("incomplete"), std::string::npos) << gap;
  const std::string one = FiguresNote(JobAt(v1::JOB_STATE_RUNNING, 7, 9, 1));
  EXPECT_NE(one.find("1 progress report could not"), std::string::npos) << one;
}

}  // namespace
}  // namespace ptrain::ptctl
