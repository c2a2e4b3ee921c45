// See command.h.
#include "worker/daemon/command.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/echo.h"

namespace ptrain {
namespace {

// A word as the shell would split it, quotes removed and $NAME expanded;
// `literal` counts its leading characters written plainly (no quote, no $
// before them): only there can an assignment's NAME= or the keyword export
// stand.
struct Word {
  std::string text;
  size_t literal = 0;
  bool plain() const { return literal == text.size(); }
};

bool IsNameChar(char c, bool first) {
  return absl::ascii_isupper(c) || absl::ascii_islower(c) || c == '_' ||
         (!first && absl::ascii_isdigit(c));
}

absl::Status Refuse(absl::string_view what, size_t at) {
  return absl::InvalidArgumentError(absl::StrCat(
      "refused: ", what, " at character ", at + 1,
      " (only NAME=VALUE ; export NAME ; and one allowed program with plain "
      "or quoted words are run)"));
}

class Lexer {
 public:
  Lexer(absl::string_view line, std::map<std::string, std::string>* vars)
      : s_(line), vars_(vars) {}

  bool done() const { return i_ >= s_.size(); }

  // The words up to the next unquoted ';' (consumed) or the end; $NAME is
  // expanded with the variables as they are now.
  absl::StatusOr<std::vector<Word>> Statement() {
    std::vector<Word> out;
    while (true) {
      while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
      if (i_ == s_.size()) return out;
      if (s_[i_] == ';') {
        ++i_;
        return out;
      }
      absl::StatusOr<Word> w = NextWord();
      if (!w.ok()) return w.status();
      out.push_back(std::move(*w));
    }
  }

 private:
  absl::StatusOr<Word> NextWord() {
    Word w;
    bool quoted = false;  // a quote or an expansion came already
    if (s_[i_] == '~' || s_[i_] == '#') {
      return Refuse(EchoQuoted(s_.substr(i_, 1)), i_);
    }
    while (i_ < s_.size() && s_[i_] != ' ' && s_[i_] != '\t' && s_[i_] != ';') {
      const char c = s_[i_];
      if (c == '\'') {
        const size_t end = s_.find('\'', i_ + 1);
        if (end == absl::string_view::npos) return Refuse("an open '", i_);
        w.text.append(s_.data() + i_ + 1, end - i_ - 1);
        quoted = true;
        i_ = end + 1;
      } else if (c == '"') {
        size_t j = i_ + 1;
        while (j < s_.size() && s_[j] != '"') {
          if (s_[j] == '$' || s_[j] == '`' || s_[j] == '\\') {
            return Refuse(absl::StrCat(EchoQuoted(s_.substr(j, 1)),
                                       " inside double quotes"),
                          j);
          }
          ++j;
        }
        if (j == s_.size()) return Refuse("an open \"", i_);
        w.text.append(s_.data() + i_ + 1, j - i_ - 1);
        quoted = true;
        i_ = j + 1;
      } else if (c == '$') {
        absl::Status s = Expand(&w.text);
        if (!s.ok()) return s;
        quoted = true;
      } else if (absl::ascii_isalnum(c) ||
                 absl::string_view("_-+=/.,:@%^").find(c) !=
                     absl::string_view::npos) {
        w.text.push_back(c);
        if (!quoted) w.literal = w.text.size();
        ++i_;
      } else {
        return Refuse(EchoQuoted(s_.substr(i_, 1)), i_);
      }
    }
    return w;
  }

  // $NAME, ${NAME} or ${NAME:-} (an unset name is empty either way).
  absl::Status Expand(std::string* out) {
    const size_t at = i_;
    ++i_;
    const bool braced = i_ < s_.size() && s_[i_] == '{';
    if (braced) ++i_;
    const size_t begin = i_;
    while (i_ < s_.size() && IsNameChar(s_[i_], i_ == begin)) ++i_;
    if (i_ == begin) return Refuse("'$' without a variable name", at);
    const std::string name(s_.substr(begin, i_ - begin));
    if (braced) {
      if (s_.substr(i_, 3) == ":-}") {
        i_ += 3;
      } else if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
      } else {
        return Refuse("a ${...} other than ${NAME} or ${NAME:-}", at);
      }
    }
    auto it = vars_->find(name);
    if (it != vars_->end()) out->append(it->second);
    return absl::OkStatus();
  }

  const absl::string_view s_;
  size_t i_ = 0;
  std::map<std::string, std::string>* vars_;
};

// The variables OpenMPI's --prefix sets; any other (LD_PRELOAD, ...) could
// change what the allowed program does.
bool MaySet(const std::string& name) {
  return name == "PATH" || name == "LD_LIBRARY_PATH" ||
         name == "DYLD_LIBRARY_PATH";
}

// NAME=VALUE with a valid NAME: the position of '=', else npos.
size_t AssignmentEquals(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) return std::string::npos;
  for (size_t i = 0; i < eq; ++i) {
    if (!IsNameChar(text[i], i == 0)) return std::string::npos;
  }
  return eq;
}

}  // namespace

absl::StatusOr<NodeCommand> ParseNodeCommand(
    absl::string_view line, const std::vector<std::string>& allowed,
    const std::map<std::string, std::string>& env) {
  // Statements are lexed one at a time, so that $NAME sees the assignments
  // before it, as in the shell.
  std::map<std::string, std::string> vars = env;
  NodeCommand out;
  Lexer lexer(line, &vars);
  while (!lexer.done()) {
    absl::StatusOr<std::vector<Word>> words = lexer.Statement();
    if (!words.ok()) return words.status();
    if (words->empty()) continue;
    const Word& first = words->front();
    size_t eq = AssignmentEquals(first.text);
    if (eq != std::string::npos && eq >= first.literal) eq = std::string::npos;
    if (!out.argv.empty()) {
      return absl::InvalidArgumentError(
          "refused: more than one command (only assignments may come before "
          "the program)");
    }
    if (words->size() == 1 && eq != std::string::npos) {
      const std::string name = first.text.substr(0, eq);
      const std::string value = first.text.substr(eq + 1);
      if (!MaySet(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "refused: setting ", Echo(name),
            " (only PATH, LD_LIBRARY_PATH and DYLD_LIBRARY_PATH)"));
      }
      vars[name] = value;
      out.assignments.push_back({name, value, false});
    } else if (words->size() == 2 && first.plain() && first.text == "export") {
      const std::string& name = (*words)[1].text;
      if (AssignmentEquals(name + "=") == std::string::npos || !MaySet(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "refused: export of ", EchoQuoted(name),
            " (only PATH, LD_LIBRARY_PATH and DYLD_LIBRARY_PATH)"));
      }
      bool found = false;
      for (NodeCommand::Assignment& a : out.assignments) {
        if (a.name == name) a.exported = found = true;
      }
      if (!found) {
        out.assignments.push_back({name, vars[name], true});
      }
    } else if (eq != std::string::npos) {
      return absl::InvalidArgumentError(
          "refused: an assignment before a command on one statement (use "
          "NAME=VALUE ; export NAME ;)");
    } else {
      for (const Word& w : *words) out.argv.push_back(w.text);
    }
  }
  if (out.argv.empty()) {
    return absl::InvalidArgumentError("refused: no program to run");
  }
  const std::string& program = out.argv.front();
  const size_t slash = program.rfind('/');
  const std::string base =
      slash == std::string::npos ? program : program.substr(slash + 1);
  if (std::find(allowed.begin(), allowed.end(), base) == allowed.end()) {
    std::string list;
    for (const std::string& a : allowed)
      absl::StrAppend(&list, list.empty() ? "" : ", ", a);
    return absl::PermissionDeniedError(
        absl::StrCat("refused: ", EchoQuoted(program),
                     " is not a program this node runs (only ", list, ")"));
  }
  return out;
}

}  // namespace ptrain
