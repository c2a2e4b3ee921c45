// ptctl's node commands: nodes, nodes approve, drain, uncordon, forget-node.
// Each calls ptcoord once, prints the answer and returns ptctl's exit code.
#ifndef PTRAIN_PTCTL_COMMANDS_NODES_H_
#define PTRAIN_PTCTL_COMMANDS_NODES_H_

#include <string>

#include "ptctl/connection.h"

namespace ptrain::ptctl {

// Lists the cluster's nodes, the registrations refused for their names and
// the nodes that wait for approval.
int Nodes(Client& client);

// ptctl drain NODE / uncordon NODE.
int Drain(Client& client, const std::string& node, bool drain);

// ptctl forget-node NODE.
int ForgetNode(Client& client, const std::string& node);

// ptctl nodes approve NODE.
int ApproveNode(Client& client, const std::string& node);

}  // namespace ptrain::ptctl

#endif  // PTRAIN_PTCTL_COMMANDS_NODES_H_
