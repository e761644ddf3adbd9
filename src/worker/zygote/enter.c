/*
 * Entering an app's sandbox from inside R: the warm parent's fork calls
 * valve_enter() (through R's .C) before it reads any of the app's files.
 * It carries out, in order, the steps valve computed for the app (the same
 * steps a plain worker's child makes between fork and exec, in
 * src/worker/sandbox/enter.rs), one per line:
 *
 *   unshare                 a mount namespace of its own
 *   slave                   mounts stay private to it (/ as a slave mount)
 *   clone N PATH            a copy of PATH (open_tree), kept as number N
 *   empty PATH              an empty tmpfs over a folder (mode 0755)
 *   scratch PATH            an empty tmpfs anyone may write to (mode 1777)
 *   null PATH               /dev/null over a file
 *   mkdir PATH              a folder made inside a cover (it may exist)
 *   place N PATH            copy N put at PATH (move_mount)
 *   fsids UID GID           the file-system uid and gid the next steps use
 *                           (the app's inside its own temporary folder, then
 *                           back to 0 0: root follows no link the app left there)
 *   chdir PATH              the working directory
 *   data BYTES              RLIMIT_DATA
 *   oom VALUE               /proc/self/oom_score_adj
 *   groups G1,G2,...        supplementary groups
 *   gid GID                 real, effective and saved gid
 *   uid UID                 real, effective and saved uid
 *   nonewprivs              PR_SET_NO_NEW_PRIVS
 *   landlock FS SCOPED      a Landlock ruleset handling those rights and scopes
 *   lpath RIGHTS PATH       a rule: RIGHTS beneath PATH (as src/worker/sandbox/landlock.rs plans)
 *   lrestrict               no new privileges, then the ruleset (valve without root)
 *   stdio PATH              stdout and stderr to PATH (the fork's FIFO), stdin
 *                           from /dev/null: nothing of the parent's pipes left.
 *                           valve puts it last, after uid: the FIFO is opened
 *                           as the app's user, write-only, never as root
 *
 * After `uid` the process is made dumpable again, as an exec'd worker is
 * (changing uid made it not): its own user may read its /proc, as for any R.
 * On failure it stops at once and says which line failed and the errno.
 * Nothing here allocates or depends on R: it is plain system calls.
 *
 * As root (the warm parent's forks), the steps must first keep the rules
 * the privileged spawner gave the parent when it started it, read once
 * when this library is loaded (VALVE_FORK_RULES: "LO HI UID GID EXTRA,..."):
 * one `uid` line, never root's nor valve's server's, in LO-HI or one of the
 * EXTRA uids the settings give apps; no gid or group root's or the
 * server's; `fsids` only the uid's own or root's. Else nothing is run.
 *
 * valve_open_env() opens the file valve wrote a fork's environment to, as
 * a handle: never through a link (O_NOFOLLOW), only a regular file of
 * valve's own uid with one name; it removes the name at once.
 *
 * valve_tempdir() gives a fork an R temporary folder of its own in its
 * TMPDIR (R's own, as R makes one at start): the parent's is not in the
 * app's view, or is the parent's.
 *
 * valve_lifeline() is the death signal of a fork: a fork's parent is an R
 * process, not valve, and a change of user clears a death signal anyway. A
 * thread of its own (which never touches R) waits on the read end of a pipe
 * whose write end only valve holds; when valve ends, however it ends, the
 * pipe hangs up and the thread kills its process.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif

/* The kernel's structures (include/uapi/linux/landlock.h), spelt out: the
 * build machine's headers may predate them. */
struct valve_ruleset_attr {
  unsigned long long handled_access_fs;
  unsigned long long handled_access_net;
  unsigned long long scoped;
};
struct valve_path_beneath {
  unsigned long long allowed_access;
  int parent_fd;
} __attribute__((packed));

#define MAX_CLONES 32
#define MAX_GROUPS 256
#define MAX_EXTRA 256

static const char *arg(const char *line, const char *cmd);

/* The rules of forks as root, from the spawner (see above). */
static int rules_read = 0;
static unsigned long rule_lo, rule_hi, rule_uid, rule_gid;
static unsigned long rule_extra[MAX_EXTRA];
static size_t rule_extras = 0;

__attribute__((constructor)) static void read_rules(void) {
  const char *r = getenv("VALVE_FORK_RULES");
  if (r == NULL) return;
  char *end;
  rule_lo = strtoul(r, &end, 10);
  if (*end != ' ') return;
  rule_hi = strtoul(end + 1, &end, 10);
  if (*end != ' ') return;
  rule_uid = strtoul(end + 1, &end, 10);
  if (*end != ' ') return;
  rule_gid = strtoul(end + 1, &end, 10);
  /* Then the extra uids, comma-separated, none at all when the list is empty. */
  if (*end == ' ') end++;
  while (*end != '\0') {
    const char *p = end;
    unsigned long u = strtoul(p, &end, 10);
    if (end == p || rule_extras == MAX_EXTRA) return;
    rule_extra[rule_extras++] = u;
    if (*end == ',') end++;
    else if (*end != '\0') return;
  }
  rules_read = 1;
}

static int uid_allowed(unsigned long u) {
  if (u == 0 || u == rule_uid) return 0;
  if (u >= rule_lo && u <= rule_hi) return 1;
  for (size_t i = 0; i < rule_extras; i++)
    if (rule_extra[i] == u) return 1;
  return 0;
}

static int gid_allowed(unsigned long g) { return g != 0 && g != rule_gid; }

/* As root: the number of the first line that breaks the rules, or -1. */
static int breaks_rules(char **lines, int n) {
  int uids = 0;
  unsigned long uid = 0;
  for (int i = 0; i < n; i++) {
    const char *a;
    if ((a = arg(lines[i], "uid")) != NULL) {
      uid = strtoul(a, NULL, 10);
      if (!uid_allowed(uid) || uids++ > 0) return i;
    }
  }
  if (uids != 1) return n > 0 ? n - 1 : 0;
  for (int i = 0; i < n; i++) {
    const char *a;
    if ((a = arg(lines[i], "gid")) != NULL && !gid_allowed(strtoul(a, NULL, 10))) return i;
    if ((a = arg(lines[i], "groups")) != NULL) {
      const char *p = a;
      while (*p) {
        char *end;
        unsigned long g = strtoul(p, &end, 10);
        if (end == p || !gid_allowed(g)) return i;
        p = (*end == ',') ? end + 1 : end;
        if (*end != ',' && *end != '\0') return i;
      }
    }
    if ((a = arg(lines[i], "fsids")) != NULL) {
      char *end;
      unsigned long u = strtoul(a, &end, 10);
      unsigned long g = strtoul(end, NULL, 10);
      if (!((u == 0 && g == 0) || (u == uid && gid_allowed(g)))) return i;
    }
  }
  return -1;
}

/* The word after the command, or NULL. */
static const char *arg(const char *line, const char *cmd) {
  size_t n = strlen(cmd);
  if (strncmp(line, cmd, n) != 0) return NULL;
  if (line[n] == '\0') return line + n;
  if (line[n] != ' ') return NULL;
  return line + n + 1;
}


/* Opens the fork's FIFO for writing (as the app's user) without waiting
 * forever for a reader: valve holds it open for reading while it waits for
 * the fork, but if valve has ended (its lifeline hangs up) or no reader comes
 * within 30 s, the fork gives up (ENXIO) rather than block before its
 * lifeline thread runs, which would leave it alive after valve. */
static int open_fifo(const char *path) {
  const char *lf = getenv("VALVE_LIFELINE");
  int lifeline = lf ? atoi(lf) : -1;
  for (int waited = 0; waited < 30000; waited += 50) {
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      struct stat st;
      int flags = fcntl(fd, F_GETFL);
      if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
        close(fd);
        errno = EINVAL; /* valve made a FIFO there: anything else is not its */
        return -1;
      }
      if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
      }
      return fd;
    }
    if (errno != ENXIO) return -1;
    if (lifeline >= 0) {
      struct pollfd p = {.fd = lifeline, .events = POLLIN};
      if (poll(&p, 1, 50) != 0) {
        errno = ENXIO; /* valve has ended: nobody will read */
        return -1;
      }
    } else {
      usleep(50000);
    }
  }
  errno = ENXIO;
  return -1;
}

static int step(const char *line, int *clones, int *ruleset) {
  const char *a;
  if ((a = arg(line, "landlock")) != NULL) {
    char *end;
    struct valve_ruleset_attr attr = {0, 0, 0};
    attr.handled_access_fs = strtoull(a, &end, 10);
    attr.scoped = strtoull(end, NULL, 10);
    int fd = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (fd < 0) return -1;
    *ruleset = fd;
    return 0;
  }
  if ((a = arg(line, "lpath")) != NULL) {
    char *path;
    struct valve_path_beneath rule;
    rule.allowed_access = strtoull(a, &path, 10);
    if (*ruleset < 0 || *path != ' ') { errno = EINVAL; return -1; }
    /* The rule's own path, never through a link (valve planned it as it was). */
    int fd = open(path + 1, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return (errno == ENOENT || errno == ELOOP) ? 0 : -1; /* gone or changed since valve planned */
    struct stat st;
    if (fstat(fd, &st) != 0 || S_ISLNK(st.st_mode)) { close(fd); return 0; } /* a link is given nothing */
    rule.parent_fd = fd;
    int r = (int)syscall(SYS_landlock_add_rule, *ruleset, 1 /* LANDLOCK_RULE_PATH_BENEATH */, &rule, 0);
    close(fd);
    return r;
  }
  if ((a = arg(line, "lrestrict")) != NULL) {
    if (*ruleset < 0) { errno = EINVAL; return -1; }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    int r = (int)syscall(SYS_landlock_restrict_self, *ruleset, 0);
    close(*ruleset);
    *ruleset = -1;
    return r;
  }
  if ((a = arg(line, "unshare")) != NULL) return unshare(CLONE_NEWNS);
  if ((a = arg(line, "slave")) != NULL) return mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL);
  if ((a = arg(line, "clone")) != NULL) {
    char *path;
    long n = strtol(a, &path, 10);
    if (n < 0 || n >= MAX_CLONES || *path != ' ') { errno = EINVAL; return -1; }
    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, path + 1, OPEN_TREE_CLONE | AT_RECURSIVE | OPEN_TREE_CLOEXEC);
    if (fd < 0) return -1;
    clones[n] = fd;
    return 0;
  }
  if ((a = arg(line, "empty")) != NULL)
    return mount("tmpfs", a, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=1m");
  if ((a = arg(line, "scratch")) != NULL)
    return mount("tmpfs", a, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=64m");
  if ((a = arg(line, "null")) != NULL) return mount("/dev/null", a, NULL, MS_BIND, NULL);
  if ((a = arg(line, "fsids")) != NULL) {
    char *end;
    uid_t u = (uid_t)strtoul(a, &end, 10);
    if (*end != ' ') { errno = EINVAL; return -1; }
    gid_t g = (gid_t)strtoul(end + 1, NULL, 10);
    if (u == 0) {
      setfsuid(0);
      setfsgid(g);
    } else {
      setfsgid(g);
      setfsuid(u);
    }
    /* -1 asks the current id without changing it. */
    if ((uid_t)setfsuid((uid_t)-1) != u || (gid_t)setfsgid((gid_t)-1) != g) { errno = EPERM; return -1; }
    return 0;
  }
  if ((a = arg(line, "mkdir")) != NULL) return (mkdir(a, 0755) == 0 || errno == EEXIST) ? 0 : -1;
  if ((a = arg(line, "place")) != NULL) {
    char *path;
    long n = strtol(a, &path, 10);
    if (n < 0 || n >= MAX_CLONES || *path != ' ' || clones[n] < 0) { errno = EINVAL; return -1; }
    int r = (int)syscall(SYS_move_mount, clones[n], "", AT_FDCWD, path + 1, MOVE_MOUNT_F_EMPTY_PATH);
    close(clones[n]);
    clones[n] = -1;
    return r;
  }
  if ((a = arg(line, "chdir")) != NULL) return chdir(a);
  if ((a = arg(line, "data")) != NULL) {
    struct rlimit r;
    r.rlim_cur = r.rlim_max = (rlim_t)strtoull(a, NULL, 10);
    return setrlimit(RLIMIT_DATA, &r);
  }
  if ((a = arg(line, "oom")) != NULL) {
    /* A fork of a parent that is root may write its own. */
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t w = write(fd, a, strlen(a));
    close(fd);
    return w < 0 ? -1 : 0;
  }
  if ((a = arg(line, "groups")) != NULL) {
    gid_t groups[MAX_GROUPS];
    size_t n = 0;
    const char *p = a;
    while (*p) {
      char *end;
      unsigned long g = strtoul(p, &end, 10);
      if (end == p || n == MAX_GROUPS) { errno = EINVAL; return -1; }
      groups[n++] = (gid_t)g;
      if (*end == ',') p = end + 1;
      else if (*end == '\0') break;
      else { errno = EINVAL; return -1; }
    }
    return setgroups(n, groups);
  }
  if ((a = arg(line, "gid")) != NULL) {
    gid_t g = (gid_t)strtoul(a, NULL, 10);
    return setresgid(g, g, g);
  }
  if ((a = arg(line, "uid")) != NULL) {
    uid_t u = (uid_t)strtoul(a, NULL, 10);
    if (setresuid(u, u, u) != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
  }
  if ((a = arg(line, "stdio")) != NULL) {
    int out = open_fifo(a);
    if (out < 0) return -1;
    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0) { close(out); return -1; }
    int r = (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) ? -1 : 0;
    close(in);
    close(out);
    return r;
  }
  if ((a = arg(line, "nonewprivs")) != NULL) return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  errno = EINVAL;
  return -1;
}

/* R: .C("valve_enter", lines, length(lines), failed = -1L, errno = 0L) */
void valve_enter(char **lines, int *n, int *failed, int *error) {
  int clones[MAX_CLONES];
  int ruleset = -1;
  for (int i = 0; i < MAX_CLONES; i++) clones[i] = -1;
  *failed = -1;
  *error = 0;
  if (geteuid() == 0) {
    int bad = rules_read ? breaks_rules(lines, *n) : 0;
    if (bad >= 0) {
      *failed = bad;
      *error = EPERM;
      return;
    }
  }
  for (int i = 0; i < *n; i++) {
    if (step(lines[i], clones, &ruleset) != 0) {
      *failed = i;
      *error = errno;
      break;
    }
  }
  for (int i = 0; i < MAX_CLONES; i++)
    if (clones[i] >= 0) close(clones[i]);
  if (ruleset >= 0) close(ruleset);
}

/* R: .C("valve_open_env", path, uid, fd = -1L, errno = 0L) */
void valve_open_env(char **path, int *uid, int *fd, int *error) {
  struct stat st;
  *fd = -1;
  *error = 0;
  int f = open(*path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (f < 0) {
    *error = errno;
    return;
  }
  if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != (uid_t)*uid || st.st_nlink != 1) {
    close(f);
    *error = EPERM;
    return;
  }
  unlink(*path);
  *fd = f;
}

/* R: .C("valve_close", fd) */
void valve_close(int *fd) {
  if (*fd >= 0) close(*fd);
}

extern char *R_TempDir;
extern void R_reInitTempDir(int die_on_fail);

/* R: .C("valve_tempdir", ok = FALSE) */
void valve_tempdir(int *ok) {
  R_TempDir = NULL;
  R_reInitTempDir(0);
  *ok = R_TempDir != NULL;
}

static void *lifeline(void *arg) {
  struct pollfd p = {.fd = (int)(long)arg, .events = POLLIN};
  for (;;) {
    int r = poll(&p, 1, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (p.revents & (POLLHUP | POLLERR | POLLNVAL))) break;
    /* valve never writes: data would be a mistake, not a reason to die. */
    char b;
    if (read(p.fd, &b, 1) == 0) break;
  }
  kill(getpid(), SIGKILL);
  return NULL;
}

/* R: .C("valve_lifeline", fd, ok = FALSE) */
void valve_lifeline(int *fd, int *ok) {
  pthread_attr_t a;
  pthread_t t;
  *ok = 0;
  if (pthread_attr_init(&a) != 0) return;
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  *ok = pthread_create(&t, &a, lifeline, (void *)(long)*fd) == 0;
  pthread_attr_destroy(&a);
}
