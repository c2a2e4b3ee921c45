#include "common/confined_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ptrain {

namespace {

// Path components with "" and "." dropped; ".." kept (the kernel judges it).
std::vector<std::string> Components(absl::string_view path) {
  std::vector<std::string> out;
  for (absl::string_view c : absl::StrSplit(path, '/')) {
    if (c.empty() || c == ".") continue;
    out.emplace_back(c);
  }
  return out;
}

std::string Join(const std::vector<std::string>& comps, size_t n) {
  if (n == 0) return ".";
  return absl::StrJoin(comps.begin(), comps.begin() + n, "/");
}

// Directories nest this deep at most in RemoveAll (checkpoints nest one).
constexpr int kMaxRemoveDepth = 32;

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.Release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<ConfinedFs> ConfinedFs::Create(
    const std::vector<std::string>& roots, absl::string_view source) {
  std::vector<std::string> clean;
  for (const std::string& r : roots) {
    if (r.empty() || r[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": data root '", r, "' is not an absolute path"));
    }
    const std::vector<std::string> comps = Components(r);
    for (const std::string& c : comps) {
      if (c == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": data root '", r,
                         "' is not resolved (it contains '..')"));
      }
    }
    clean.push_back(absl::StrCat("/", absl::StrJoin(comps, "/")));
  }
  return ConfinedFs(std::move(clean));
}

absl::StatusOr<ConfinedFs> ConfinedFs::FromEnvironment() {
  const char* v = std::getenv(kRootsEnv);
  if (v == nullptr) return ConfinedFs();
  std::vector<std::string> roots = absl::StrSplit(v, ':', absl::SkipEmpty());
  return Create(roots);
}

absl::Status ConfinedFs::Error(int err, absl::string_view what,
                               absl::string_view path,
                               absl::string_view field) const {
  const std::string roots = absl::StrJoin(roots_, ":");
  switch (err) {
    case EXDEV:
      if (confined()) {
        return absl::PermissionDeniedError(
            absl::StrCat(field, ": '", path, "' leads outside the data roots (",
                         roots, ") through a symbolic link or '..'"));
      }
      break;
    case ELOOP:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": cannot ", what, " '", path,
                       "': too many levels of symbolic links (a loop, or a "
                       "/proc magic link)"));
    case ENOENT:
      return absl::NotFoundError(
          absl::StrCat(field, ": no such file or folder '", path, "'"));
    case ENOTDIR:
      return absl::NotFoundError(absl::StrCat(field, ": cannot ", what, " '",
                                              path, "': not a folder"));
    case EISDIR:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", path, "' is a folder, not a file"));
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(absl::StrCat(
          field, ": cannot ", what, " '", path, "': ", std::strerror(err)));
    default:
      break;
  }
  return absl::InternalError(absl::StrCat(field, ": cannot ", what, " '", path,
                                          "': ", std::strerror(err)));
}

absl::StatusOr<ConfinedFs::Base> ConfinedFs::Locate(
    absl::string_view path, absl::string_view field) const {
  if (path.empty() || path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not a usable path"));
  }
  Base base;
  if (!confined()) {
    if (path[0] != '/') {
      base.fd = AT_FDCWD;
      base.rel = std::string(path);
      return base;
    }
    base.owned = UniqueFd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!base.owned.valid()) return Error(errno, "open", "/", field);
    base.fd = base.owned.get();
    const std::vector<std::string> comps = Components(path);
    base.rel = Join(comps, comps.size());
    return base;
  }
  std::string absolute(path);
  if (path[0] != '/') {
    char cwd[4096];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr) {
      return Error(errno, "resolve", path, field);
    }
    absolute = absl::StrCat(cwd, "/", path);
  }
  // The longest root that is a prefix of the path, component by component;
  // what follows it is resolved by the kernel beneath that root.
  const std::vector<std::string> comps = Components(absolute);
  const std::string* best = nullptr;
  size_t best_len = 0;
  for (const std::string& root : roots_) {
    const std::vector<std::string> rc = Components(root);
    if (rc.size() > comps.size() || (best != nullptr && rc.size() < best_len)) {
      continue;
    }
    bool prefix = true;
    for (size_t i = 0; i < rc.size() && prefix; ++i) prefix = rc[i] == comps[i];
    if (prefix) {
      best = &root;
      best_len = rc.size();
    }
  }
  if (best == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": '", path, "' is outside the data roots (",
                     absl::StrJoin(roots_, ":"), ")"));
  }
  base.owned =
      UniqueFd(::open(best->c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!base.owned.valid()) {
    return Error(errno, "open the data root", *best, field);
  }
  base.fd = base.owned.get();
  std::vector<std::string> rest(comps.begin() + best_len, comps.end());
  base.rel = Join(rest, rest.size());
  return base;
}

int ConfinedFs::OpenAt(int dirfd, const std::string& rel, int flags,
                       mode_t mode) const {
  if (!confined()) {
    const int fd = ::openat(dirfd, rel.c_str(), flags | O_CLOEXEC, mode);
    return fd >= 0 ? fd : -errno;
  }
  struct open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) != 0 ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  // EAGAIN: a concurrent rename or mount raced the lookup; look again.
  for (int attempt = 0;; ++attempt) {
    const long fd =
        ::syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != EAGAIN || attempt >= 64) return -errno;
  }
}

absl::StatusOr<UniqueFd> ConfinedFs::OpenRel(const Base& base,
                                             const std::string& rel, int flags,
                                             mode_t mode,
                                             absl::string_view path,
                                             absl::string_view field) const {
  const int fd = OpenAt(base.fd, rel, flags, mode);
  if (fd < 0) return Error(-fd, "open", path, field);
  return UniqueFd(fd);
}

absl::StatusOr<UniqueFd> ConfinedFs::Open(absl::string_view path, int flags,
                                          absl::string_view field,
                                          mode_t mode) const {
  auto base = Locate(path, field);
  if (!base.ok()) return base.status();
  return OpenRel(*base, base->rel, flags, mode, path, field);
}

absl::Status ConfinedFs::OpenParent(absl::string_view path,
                                    absl::string_view field, UniqueFd* parent,
                                    std::string* leaf) const {
  auto base = Locate(path, field);
  if (!base.ok()) return base.status();
  std::string rel = base->rel;
  while (rel.size() > 1 && rel.back() == '/') rel.pop_back();
  const size_t slash = rel.rfind('/');
  *leaf = slash == std::string::npos ? rel : rel.substr(slash + 1);
  const std::string dir =
      slash == std::string::npos ? "." : rel.substr(0, slash);
  if (leaf->empty() || *leaf == "." || *leaf == "..") {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path, "' does not name a file or folder in a folder"));
  }
  auto fd = OpenRel(*base, dir.empty() ? "/" : dir, O_PATH | O_DIRECTORY, 0,
                    path, field);
  if (!fd.ok()) return fd.status();
  *parent = std::move(*fd);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ConfinedFs::ReadFile(absl::string_view path,
                                                 absl::string_view field,
                                                 int64_t max_bytes) const {
  // O_NONBLOCK: a FIFO in place of a file must not block the open.
  auto fd = Open(path, O_RDONLY | O_NONBLOCK, field);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return Error(errno, "stat", path, field);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not a regular file"));
  }
  if (st.st_size > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": '", path, "' is ", st.st_size,
                     " bytes, more than the ", max_bytes, " allowed"));
  }
  // Read to the end, not to st_size: the file may change meanwhile, and
  // the limit holds either way.
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  char more[1 << 16];
  for (;;) {
    const bool in_place = got < out.size();
    char* dst = in_place ? out.data() + got : more;
    const size_t room = in_place ? out.size() - got : sizeof(more);
    const ssize_t n = ::read(fd->get(), dst, room);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(errno, "read", path, field);
    }
    if (static_cast<int64_t>(got) + n > max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(field, ": '", path, "' is more than the ", max_bytes,
                       " bytes allowed"));
    }
    if (!in_place) out.append(more, static_cast<size_t>(n));
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

absl::Status ConfinedFs::Check(absl::string_view path,
                               absl::string_view field) const {
  if (!confined()) return absl::OkStatus();
  auto base = Locate(path, field);
  if (!base.ok()) return base.status();
  const std::vector<std::string> comps = Components(base->rel);
  for (size_t n = comps.size();; --n) {
    const int fd = OpenAt(base->fd, Join(comps, n), O_PATH, 0);
    if (fd >= 0) {
      ::close(fd);
      return absl::OkStatus();
    }
    if (-fd != ENOENT || n == 0) return Error(-fd, "open", path, field);
  }
}

absl::StatusOr<bool> ConfinedFs::Exists(absl::string_view path,
                                        absl::string_view field) const {
  auto base = Locate(path, field);
  if (!base.ok()) return base.status();
  const int fd = OpenAt(base->fd, base->rel, O_PATH, 0);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  if (-fd == ENOENT || -fd == ENOTDIR) return false;
  return Error(-fd, "look up", path, field);
}

absl::Status ConfinedFs::MakeDirs(absl::string_view path,
                                  absl::string_view field) const {
  auto base = Locate(path, field);
  if (!base.ok()) return base.status();
  const std::vector<std::string> comps = Components(base->rel);
  for (size_t i = 1; i <= comps.size(); ++i) {
    const std::string prefix = Join(comps, i);
    int fd = OpenAt(base->fd, prefix, O_PATH | O_DIRECTORY, 0);
    if (fd == -ENOENT) {
      auto parent = OpenRel(*base, Join(comps, i - 1), O_PATH | O_DIRECTORY, 0,
                            path, field);
      if (!parent.ok()) return parent.status();
      if (::mkdirat(parent->get(), comps[i - 1].c_str(), 0755) != 0 &&
          errno != EEXIST) {
        return Error(errno, "create folder", path, field);
      }
      // Open it again, confined: it may have been swapped meanwhile.
      fd = OpenAt(base->fd, prefix, O_PATH | O_DIRECTORY, 0);
    }
    if (fd < 0) return Error(-fd, "create folder", path, field);
    ::close(fd);
  }
  return absl::OkStatus();
}

absl::Status ConfinedFs::Rename(absl::string_view from, absl::string_view to,
                                absl::string_view field) const {
  UniqueFd from_dir, to_dir;
  std::string from_leaf, to_leaf;
  if (auto s = OpenParent(from, field, &from_dir, &from_leaf); !s.ok()) {
    return s;
  }
  if (auto s = OpenParent(to, field, &to_dir, &to_leaf); !s.ok()) return s;
  if (::renameat(from_dir.get(), from_leaf.c_str(), to_dir.get(),
                 to_leaf.c_str()) != 0) {
    return Error(errno, absl::StrCat("rename to '", to, "'"), from, field);
  }
  return absl::OkStatus();
}

absl::Status ConfinedFs::Remove(absl::string_view path,
                                absl::string_view field) const {
  UniqueFd dir;
  std::string leaf;
  if (auto s = OpenParent(path, field, &dir, &leaf); !s.ok()) {
    return s.code() == absl::StatusCode::kNotFound ? absl::OkStatus() : s;
  }
  if (::unlinkat(dir.get(), leaf.c_str(), 0) != 0 && errno != ENOENT) {
    return Error(errno, "remove", path, field);
  }
  return absl::OkStatus();
}

namespace {

// Removes entry `name` of folder `dirfd`, recursively, never following a
// symlink: a folder is opened O_NOFOLLOW relative to its parent's fd.
int RemoveAt(int dirfd, const char* name, int depth) {
  if (depth > kMaxRemoveDepth) return ELOOP;
  struct stat st;
  if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? 0 : errno;
  }
  if (S_ISDIR(st.st_mode)) {
    const int fd =
        ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      DIR* d = ::fdopendir(fd);
      if (d == nullptr) {
        const int err = errno;
        ::close(fd);
        return err;
      }
      std::vector<std::string> names;
      while (const dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 &&
            std::strcmp(e->d_name, "..") != 0) {
          names.emplace_back(e->d_name);
        }
      }
      int err = 0;
      for (const std::string& n : names) {
        err = RemoveAt(::dirfd(d), n.c_str(), depth + 1);
        if (err != 0) break;
      }
      ::closedir(d);
      if (err != 0) return err;
      if (::unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
        return errno;
      }
      return 0;
    }
    if (errno != ENOTDIR && errno != ELOOP) return errno;
    // Swapped for something else since fstatat: unlink that instead.
  }
  if (::unlinkat(dirfd, name, 0) != 0 && errno != ENOENT) return errno;
  return 0;
}

}  // namespace

absl::Status ConfinedFs::RemoveAll(absl::string_view path,
                                   absl::string_view field) const {
  UniqueFd dir;
  std::string leaf;
  if (auto s = OpenParent(path, field, &dir, &leaf); !s.ok()) {
    return s.code() == absl::StatusCode::kNotFound ? absl::OkStatus() : s;
  }
  if (const int err = RemoveAt(dir.get(), leaf.c_str(), 0); err != 0) {
    return Error(err, "remove", path, field);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ConfinedFs::Entry>> ConfinedFs::List(
    absl::string_view path, absl::string_view field) const {
  auto fd = Open(path, O_RDONLY | O_DIRECTORY, field);
  if (!fd.ok()) return fd.status();
  DIR* d = ::fdopendir(fd->get());
  if (d == nullptr) return Error(errno, "list", path, field);
  fd->Release();  // the DIR owns it now
  std::vector<Entry> out;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) {
      continue;
    }
    Entry entry;
    entry.name = e->d_name;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      entry.is_dir =
          ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISDIR(st.st_mode);
    } else {
      entry.is_dir = e->d_type == DT_DIR;
    }
    out.push_back(std::move(entry));
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return Error(err, "list", path, field);
  return out;
}

absl::Status ConfinedFs::SyncDir(absl::string_view path,
                                 absl::string_view field) const {
  auto fd = Open(path, O_RDONLY | O_DIRECTORY, field);
  if (!fd.ok()) return fd.status();
  if (::fsync(fd->get()) != 0) return Error(errno, "fsync", path, field);
  return absl::OkStatus();
}

}  // namespace ptrain
