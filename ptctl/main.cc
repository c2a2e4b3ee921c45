// ptctl: the command line over ptcoord's JobService (submit, get, list, logs,
// cancel, pause, resume, delete, watch, checkpoints, diagnose, and the nodes of
// a cluster: nodes, nodes approve, drain, uncordon, forget-node) and the
// layout planner (plan, which needs no ptcoord), in plain text
// or TLS (--tls-ca). Spec files are checked here with the same library ptcoord
// uses, before anything is sent. This file is its wiring: flags and subcommands
// (CLI11) to the commands of commands_jobs.h, commands_nodes.h and watch.h,
// over the connection of connection.h.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/job_state.h"
#include "common/thread_entry.h"
#include "ptctl/commands_jobs.h"
#include "ptctl/commands_nodes.h"
#include "ptctl/commands_plan.h"
#include "ptctl/connection.h"
#include "ptctl/format.h"
#include "ptctl/watch.h"

namespace {

using ptrain::kExitBadInput;
using ptrain::ptctl::Options;

// What the subcommands take.
struct Args {
  std::string file, job, node, list_state, from, owner, priority;
  std::vector<std::string> sets;
  bool watch = false, follow = false, purge = false, dry_run = false,
       mine = false;
  int attempt = 0, list_limit = 0, rank = -1;
  int64_t steps = 0;
  ptrain::ptctl::PlanArgs plan;
};

struct Subcommands {
  CLI::App *submit, *get, *list, *logs, *events, *cancel, *pause, *resume,
      *extend, *del, *watch, *checkpoints, *diagnose, *nodes, *approve, *drain,
      *uncordon, *forget, *whoami, *priority, *queue, *plan;
};

// The flags every subcommand takes, their defaults from the environment.
void AddGlobalFlags(CLI::App& app, Options& o) {
  if (const char* s = std::getenv("PTCTL_SERVER")) {
    o.server = s;
    o.server_from = "PTCTL_SERVER";
  }
  if (const char* t = std::getenv("PTCTL_TOKEN")) o.token = t;
  app.add_option("--server", o.server,
                 absl::StrCat("ptcoord address host:port (or PTCTL_SERVER; "
                              "default ",
                              ptrain::ptctl::kDefaultServer, ")"));
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
}

// `plan`: the layout planner (no ptcoord).
CLI::App* AddPlanCommand(CLI::App& app, ptrain::ptctl::PlanArgs& a) {
  CLI::App* plan = app.add_subcommand(
      "plan",
      "the best layouts of a job's model on a cluster, predicted from a "
      "hardware profile (no ptcoord needed)");
  plan->add_option("FILE", a.file, "job spec")->required();
  plan->add_option("--set", a.sets,
                   "override a field, e.g. --set train.global_batch=512");
  plan->add_option("--nodes", a.nodes, "nodes (default 1)");
  plan->add_option("--gpus-per-node", a.gpus_per_node,
                   "GPUs a node (CPU profiles: ranks a node; default 8)");
  plan->add_option("--profile", a.profile,
                   "a shipped profile (a100, h100, h200) or a profile file "
                   "(ptworker profile)")
      ->required();
  plan->add_flag("--fixed", a.fixed, "cost only the spec's own layout");
  return plan;
}

Subcommands AddSubcommands(CLI::App& app, Args& a) {
  Subcommands c;
  c.submit = app.add_subcommand("submit", "submit a job spec (YAML)");
  c.submit->add_option("FILE", a.file, "job spec")->required();
  c.submit->add_option("--set", a.sets,
                       "override a field: dotted.path=value (repeatable)");
  c.submit->add_option(
      "--from", a.from,
      "JOB[@STEP]: start from that job's checkpoint at STEP (default: its "
      "newest), optimizer and data position included; same model");
  CLI::Option* watch = c.submit->add_flag(
      "--watch", a.watch, "follow the job; exit 0 only if it SUCCEEDED");
  c.submit
      ->add_flag("--dry-run", a.dry_run,
                 "submit nothing: print the effective spec, the layout, "
                 "each rank's memory and where ptcoord would start it or "
                 "why it would wait")
      ->excludes(watch);
  c.get = app.add_subcommand("get", "show one job");
  c.get->add_option("JOB", a.job)->required();
  c.list = app.add_subcommand("list", "list jobs");
  c.list->add_option("--limit", a.list_limit, "only the newest N jobs (0: all)")
      ->check(CLI::Range(0, 10000));
  c.list->add_option("--state", a.list_state, "only jobs in this state")
      ->check(CLI::IsMember(ptrain::LowerStateNames(), CLI::ignore_case));
  CLI::Option* mine =
      c.list->add_flag("--mine", a.mine, "only the jobs I submitted");
  c.list->add_option("--owner", a.owner, "only this user's jobs")
      ->excludes(mine);
  c.whoami = app.add_subcommand(
      "whoami", "show the user my token is, its role and its quota");
  c.priority = app.add_subcommand(
      "priority",
      "change a job's priority: low, normal, high or 0..1000 (higher starts "
      "first and may preempt lower)");
  c.priority->add_option("JOB", a.job)->required();
  c.priority->add_option("PRIORITY", a.priority)->required();
  c.queue = app.add_subcommand(
      "queue",
      "the waiting jobs in the order they would start, and why each waits");
  c.logs = app.add_subcommand("logs", "print an attempt's output");
  c.logs->add_option("JOB", a.job)->required();
  c.logs->add_flag("-f,--follow", a.follow,
                   "keep printing until the attempt ends");
  c.logs->add_option("--rank", a.rank, "only the lines of this rank")
      ->check(CLI::Range(0, 1 << 20));
  c.logs
      ->add_option("--attempt", a.attempt,
                   "attempt number (default: the latest)")
      ->check(CLI::NonNegativeNumber);
  c.cancel = app.add_subcommand("cancel", "cancel a job (idempotent)");
  c.cancel->add_option("JOB", a.job)->required();
  c.pause = app.add_subcommand(
      "pause",
      "stop a job until `resume`: a running one saves a checkpoint of the "
      "step it is in first (idempotent)");
  c.pause->add_option("JOB", a.job)->required();
  c.resume = app.add_subcommand(
      "resume", "queue a paused job again; it goes on from its checkpoint");
  c.resume->add_option("JOB", a.job)->required();
  c.extend = app.add_subcommand(
      "extend",
      "run a SUCCEEDED job on to more steps, from its last checkpoint");
  c.extend->add_option("JOB", a.job)->required();
  c.extend->add_option("--steps", a.steps, "the new train.steps")
      ->required()
      ->check(CLI::PositiveNumber);
  c.events = app.add_subcommand(
      "events",
      "what happened to a job, oldest first (attempts, restarts, "
      "pauses, cancels)");
  c.events->add_option("JOB", a.job)->required();
  c.del = app.add_subcommand(
      "delete",
      "forget an ended job (its record, attempts, logs); its checkpoints "
      "stay unless --purge");
  c.del->add_option("JOB", a.job)->required();
  c.del->add_flag("--purge", a.purge,
                  "also remove the job's checkpoint folder");
  c.watch = app.add_subcommand("watch", "follow a job until it ends");
  c.watch->add_option("JOB", a.job)->required();
  c.checkpoints = app.add_subcommand("checkpoints", "list a job's checkpoints");
  c.checkpoints->add_option("JOB", a.job)->required();
  c.diagnose = app.add_subcommand(
      "diagnose",
      "say which ranks a hung job waits for, and where (flight recorder "
      "dumps)");
  c.diagnose->add_option("JOB", a.job)->required();
  c.diagnose
      ->add_option("--attempt", a.attempt,
                   "attempt number (default: the running one, else the "
                   "newest with dumps)")
      ->check(CLI::NonNegativeNumber);
  c.nodes = app.add_subcommand("nodes", "list the cluster's nodes");
  c.approve = c.nodes->add_subcommand(
      "approve",
      "let jobs run on a node that waits for approval (ptcoord "
      "--require-node-approval)");
  c.approve->add_option("NODE", a.node, "node name")->required();
  c.drain = app.add_subcommand(
      "drain", "take a node out of scheduling (running jobs stay)");
  c.drain->add_option("NODE", a.node, "node name")->required();
  c.uncordon = app.add_subcommand("uncordon", "let jobs start on a node again");
  c.uncordon->add_option("NODE", a.node, "node name")->required();
  c.forget = app.add_subcommand(
      "forget-node",
      "forget a node that is down and idle (reinstalled, retired): its name "
      "may register afresh");
  c.forget->add_option("NODE", a.node, "node name")->required();
  c.plan = AddPlanCommand(app, a.plan);
  return c;
}

// Runs the subcommand given; its exit code.
int Dispatch(const Subcommands& c, const Args& a,
             ptrain::ptctl::Client& client) {
  namespace cmd = ptrain::ptctl;
  if (*c.submit) {
    return cmd::Submit(client, a.file, a.sets, a.watch, a.dry_run, a.from);
  }
  if (*c.get) return cmd::Get(client, a.job);
  if (*c.list) {
    return cmd::List(client, a.list_limit, a.list_state, a.owner, a.mine);
  }
  if (*c.whoami) return cmd::WhoAmI(client);
  if (*c.priority) return cmd::Priority(client, a.job, a.priority);
  if (*c.queue) return cmd::Queue(client);
  if (*c.logs) return cmd::Logs(client, a.job, a.follow, a.attempt, a.rank);
  if (*c.cancel) return cmd::Cancel(client, a.job);
  if (*c.pause) return cmd::PauseOrResume(client, a.job, true);
  if (*c.resume) return cmd::PauseOrResume(client, a.job, false);
  if (*c.extend) return cmd::Extend(client, a.job, a.steps);
  if (*c.del) return cmd::Delete(client, a.job, a.purge);
  if (*c.events) return cmd::Events(client, a.job);
  if (*c.watch) return cmd::Watch(client, a.job);
  if (*c.checkpoints) return cmd::Checkpoints(client, a.job);
  if (*c.diagnose) return cmd::Diagnose(client, a.job, a.attempt);
  if (*c.approve) return cmd::ApproveNode(client, a.node);
  if (*c.nodes) return cmd::Nodes(client);
  if (*c.drain) return cmd::Drain(client, a.node, true);
  if (*c.uncordon) return cmd::Drain(client, a.node, false);
  if (*c.forget) return cmd::ForgetNode(client, a.node);
  return kExitBadInput;
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
  AddGlobalFlags(app, o);
  Args args;
  const Subcommands subcommands = AddSubcommands(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitBadInput;
  }
  const auto from = [&app](const char* flag, const char* env) {
    return std::string(app.count(flag) > 0 ? flag : env);
  };
  // plan needs no coordinator.
  if (*subcommands.plan) {
    args.plan.json = o.output == "json";
    return ptrain::ptctl::Plan(args.plan);
  }
  if (app.count("--server") > 0) o.server_from = "--server";
  o.token_from = from("--token", "PTCTL_TOKEN");
  o.tls_ca_from = from("--tls-ca", "PTCTL_TLS_CA");
  o.tls_cert_from = from("--tls-cert", "PTCTL_TLS_CERT");
  o.tls_key_from = from("--tls-key", "PTCTL_TLS_KEY");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      ptrain::ptctl::MakeChannel(o);
  if (!channel.ok()) {
    std::fprintf(stderr, "ptctl: error: %s\n",
                 std::string(channel.status().message()).c_str());
    return kExitBadInput;
  }
  ptrain::ptctl::Client client(o, *channel);
  return Dispatch(subcommands, args, client);
}

}  // namespace

int main(int argc, char** argv) {
  return ptrain::MainEntry([&] { return Run(argc, argv); });
}
