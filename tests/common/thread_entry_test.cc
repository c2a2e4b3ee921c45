// ThreadEntry and MainEntry: an exception that escapes a thread's work ends
// the process with exit 1 and one line naming the thread and the error,
// where std::terminate would abort (exit 134); work that returns normally
// is untouched.
#include "common/thread_entry.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <new>
#include <stdexcept>
#include <string>
#include <thread>

namespace ptrain {
namespace {

TEST(ThreadEntryDeathTest, AnExceptionEndsTheProcessWithExit1NamingTheThread) {
  EXPECT_EXIT(
      {
        std::thread(ThreadEntry("prepare-encode", [] {
          throw std::bad_alloc();
        })).join();
      },
      ::testing::ExitedWithCode(1),
      "^[^\n]*: error: thread prepare-encode: std::bad_alloc\n$");
  EXPECT_EXIT(
      {
        std::thread(ThreadEntry("supervisor", [] {
          throw std::runtime_error("two\nlines");
        })).join();
      },
      ::testing::ExitedWithCode(1),
      "^[^\n]*: error: thread supervisor: two lines\n$");
  EXPECT_EXIT(
      { std::thread(ThreadEntry("odd", [] { throw 7; })).join(); },
      ::testing::ExitedWithCode(1),
      "error: thread odd: an exception that is not a std::exception\n$");
}

TEST(ThreadEntryDeathTest, MainsExceptionEndsTheProcessWithExit1) {
  EXPECT_EXIT(MainEntry([]() -> int { throw std::out_of_range("key"); }),
              ::testing::ExitedWithCode(1), "error: thread main: key\n$");
}

TEST(ThreadEntry, WorkThatReturnsRunsOnceOnANamedThread) {
  int runs = 0;
  std::string name;
  std::thread(ThreadEntry("a-rather-long-thread-name", [&] {
    ++runs;
    char buf[16] = {};
    pthread_getname_np(pthread_self(), buf, sizeof(buf));
    name = buf;
  })).join();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(name, "a-rather-long-t");  // the kernel keeps 15 bytes
  EXPECT_EQ(MainEntry([] { return 42; }), 42);
}

}  // namespace
}  // namespace ptrain
