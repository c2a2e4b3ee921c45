// ParseNodeCommand on what OpenMPI really sends its launch agent (captured
// from mpirun 4.1 with and without --prefix), and on what a join token must
// not buy: other programs, pipes, redirections, substitutions, a second
// command.
#include "worker/daemon/command.h"

#include <gtest/gtest.h>

namespace ptrain {
namespace {

const std::vector<std::string> kAllowed = {"orted", "ptworker"};
const std::map<std::string, std::string> kEnv = {{"PATH", "/bin"}};

// The words after HOST, joined by spaces as the agent does.
constexpr const char* kPlain =
    " orted --daemonize -mca ess \"env\" -mca ess_base_jobid \"1699741696\" "
    "-mca ess_base_vpid 1 -mca ess_base_num_procs \"2\" -mca orte_node_regex "
    "\"vm,fakenode@0(2)\" -mca orte_hnp_uri "
    "\"1699741696.0;tcp://192.0.2.2:43745;tcp6://[fd00::2]:42339\" --mca "
    "plm_rsh_agent \"/usr/bin/ptrsh\" --mca plm_rsh_no_tree_spawn \"1\" -mca "
    "plm \"rsh\" -mca pmix \"^s1,s2,cray,isolated\"";

constexpr const char* kPrefix =
    "          PATH=/usr/bin:$PATH ; export PATH ; "
    "LD_LIBRARY_PATH=/usr/lib:${LD_LIBRARY_PATH:-} ; export LD_LIBRARY_PATH "
    "; DYLD_LIBRARY_PATH=/usr/lib:${DYLD_LIBRARY_PATH:-} ; export "
    "DYLD_LIBRARY_PATH ;   /usr/bin/orted -mca ess \"env\" -mca "
    "orte_hnp_uri \"1696202752.0;tcp://192.0.2.2:47089\" --tree-spawn -mca "
    "routed \"radix\" -mca pmix \"^s1,s2,cray,isolated\"";

TEST(ParseNodeCommand, TakesOpenMpisDaemonLaunch) {
  auto c = ParseNodeCommand(kPlain, kAllowed, kEnv);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->assignments.empty());
  ASSERT_EQ(c->argv.size(), 32u);
  EXPECT_EQ(c->argv[0], "orted");
  EXPECT_EQ(c->argv[1], "--daemonize");
  EXPECT_EQ(c->argv[2], "-mca");
  EXPECT_EQ(c->argv[4], "env");
  // Quotes removed; what they held kept whole, ';' and brackets included.
  EXPECT_EQ(c->argv[16], "vm,fakenode@0(2)");
  EXPECT_EQ(c->argv[18], "orte_hnp_uri");
  EXPECT_EQ(c->argv[19],
            "1699741696.0;tcp://192.0.2.2:43745;tcp6://[fd00::2]:42339");
  EXPECT_EQ(c->argv.back(), "^s1,s2,cray,isolated");
}

TEST(ParseNodeCommand, TakesThePrefixAssignmentsInOrder) {
  auto c = ParseNodeCommand(kPrefix, kAllowed, kEnv);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->assignments.size(), 3u);
  EXPECT_EQ(c->assignments[0].name, "PATH");
  EXPECT_EQ(c->assignments[0].value, "/usr/bin:/bin");  // $PATH expanded
  EXPECT_TRUE(c->assignments[0].exported);
  EXPECT_EQ(c->assignments[1].name, "LD_LIBRARY_PATH");
  EXPECT_EQ(c->assignments[1].value, "/usr/lib:");  // unset: empty
  EXPECT_EQ(c->assignments[2].name, "DYLD_LIBRARY_PATH");
  EXPECT_EQ(c->argv[0], "/usr/bin/orted");
  EXPECT_EQ(c->argv[5], "orte_hnp_uri");
  EXPECT_EQ(c->argv[6], "1696202752.0;tcp://192.0.2.2:47089");
  EXPECT_EQ(c->argv.back(), "^s1,s2,cray,isolated");
  // A later $NAME sees the earlier assignment.
  auto d = ParseNodeCommand(
      "PATH=/x ; LD_LIBRARY_PATH=${PATH}y ; export LD_LIBRARY_PATH ; "
      "ptworker --config $LD_LIBRARY_PATH",
      kAllowed, kEnv);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->assignments[1].value, "/xy");
  EXPECT_FALSE(d->assignments[0].exported);
  EXPECT_TRUE(d->assignments[1].exported);
  EXPECT_EQ(d->argv, (std::vector<std::string>{"ptworker", "--config", "/xy"}));
}

TEST(ParseNodeCommand, RefusesProgramsOffTheList) {
  for (const char* line :
       {"sh -c id", "/bin/sh", "PATH=/tmp ; export PATH ; bash",
        "/tmp/orted-not", "orted2 -mca x y", "'sh' -c id"}) {
    auto c = ParseNodeCommand(line, kAllowed, kEnv);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied) << line;
  }
  // A path whose last part is allowed is allowed (resolved where it runs).
  EXPECT_TRUE(ParseNodeCommand("/opt/mpi/bin/orted", kAllowed, kEnv).ok());
}

TEST(ParseNodeCommand, RefusesWhatAShellWouldInterpret) {
  for (const char* line : {
           "orted ; sh",           // a second command
           "orted ; orted",        // even an allowed one
           "orted | sh",           // pipe
           "orted && sh",          // list
           "orted > /etc/passwd",  // redirection
           "orted < /etc/shadow",  //
           "orted `id`",           // substitution
           "orted $(id)",          //
           "orted \"$(id)\"",      // inside double quotes
           "orted \"`id`\"",       //
           "orted \"a\\\"b\"",     // escapes
           "orted a\\ b",          //
           "orted *",              // glob
           "orted ?",              //
           "orted [ab]",           //
           "orted ~/x",            // tilde
           "orted # comment",      //
           "orted 'open",          // open quotes
           "orted \"open",         //
           "orted ${X:=y}",        // other expansions
           "orted $",              //
           "X=1 orted",            // assignment on the command's line
           "export 1X ; orted",    // not a name
           "LD_PRELOAD=/tmp/x.so ; export LD_PRELOAD ; orted",  // not PATH
           "export LD_PRELOAD ; orted",
           "HOME=/tmp ; orted",
           "",                // nothing
           "A=1 ; export A",  // no program
           "orted &",         // background
           "(orted)",         // subshell
           "orted {a,b}",     // brace expansion
       }) {
    auto c = ParseNodeCommand(line, kAllowed, kEnv);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
        << "[" << line << "] " << c.status();
    EXPECT_NE(c.status().message().find("refused"), std::string::npos)
        << c.status();
  }
}

}  // namespace
}  // namespace ptrain
