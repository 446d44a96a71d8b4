/* The kernel-facing hostile helper of tests/suite/sandbox_kernel.rs: each
 * subcommand tries every way it knows and prints one line per try,
 * "NAME ok" or "NAME errno=N" (exit 0 either way: the test asserts the
 * exact outcome of each try, and what is left on the host). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/openat2.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <termios.h>

static void say(const char *name, long r) {
    if (r < 0) printf("%s errno=%d\n", name, errno); else printf("%s ok\n", name);
}

static char buf[4096];
static const char *at(const char *dir, const char *name) {
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* An empty file NAME in DIR, mode 0755 (the target of the mode changes). */
static int plain(const char *dir, const char *name) {
    return open(at(dir, name), O_CREAT | O_WRONLY | O_CLOEXEC, 0755);
}

/* Every way to give a file or directory in DIR a set-id bit. */
static int setid(const char *dir) {
    int fd = plain(dir, "f");
    if (fd < 0) { say("setup", -1); return 0; }
    const char *f = strdup(at(dir, "f"));
    say("chmod-4755", syscall(SYS_chmod, f, 04755));
    say("chmod-2755", syscall(SYS_chmod, f, 02755));
    say("chmod-6755", syscall(SYS_chmod, f, 06755));
    /* Bits the kernel drops (umode_t is 16 bits; the register is 64). */
    say("chmod-high-bits", syscall(SYS_chmod, f, 0xffff0000UL | 04755));
    say("chmod-upper-word", syscall(SYS_chmod, f, (1UL << 32) | 04755));
    say("fchmod-4755", syscall(SYS_fchmod, fd, 04755));
    say("fchmod-2711", syscall(SYS_fchmod, fd, 02711));
    say("fchmodat-4755", syscall(SYS_fchmodat, AT_FDCWD, f, 04755));
    say("fchmodat2-2755", syscall(452, AT_FDCWD, f, 02755, 0));
    /* Through the descriptor's magic link. */
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    say("chmod-proc-fd", syscall(SYS_chmod, self, 04755));
    say("mkdir-2755", syscall(SYS_mkdir, at(dir, "d-mkdir"), 02755));
    say("mkdirat-6755", syscall(SYS_mkdirat, AT_FDCWD, at(dir, "d-mkdirat"), 06755));
    say("mknod-reg-4755", syscall(SYS_mknod, at(dir, "n-mknod"), S_IFREG | 04755, 0));
    say("mknodat-reg-2755", syscall(SYS_mknodat, AT_FDCWD, at(dir, "n-mknodat"), S_IFREG | 02755, 0));
    say("open-creat-4755", syscall(SYS_open, at(dir, "o-open"), O_CREAT | O_WRONLY, 04755));
    say("openat-creat-2755", syscall(SYS_openat, AT_FDCWD, at(dir, "o-openat"), O_CREAT | O_WRONLY | O_EXCL, 02755));
    say("creat-4755", syscall(SYS_creat, at(dir, "o-creat"), 04755));
    /* An unnamed file with the bit, then given a name. */
    long t = syscall(SYS_openat, AT_FDCWD, dir, O_TMPFILE | O_WRONLY, 04755);
    say("open-tmpfile-4755", t);
    if (t >= 0) {
        char p[64];
        snprintf(p, sizeof p, "/proc/self/fd/%ld", t);
        say("link-tmpfile", linkat(AT_FDCWD, p, AT_FDCWD, at(dir, "o-tmpfile"), AT_SYMLINK_FOLLOW));
    }
    struct open_how how = { .flags = O_CREAT | O_WRONLY, .mode = 04755 };
    say("openat2-creat-4755", syscall(SYS_openat2, AT_FDCWD, at(dir, "o-openat2"), &how, sizeof how));
    say("io_uring_setup", syscall(SYS_io_uring_setup, 1, calloc(1, 256)));
    /* File capabilities: v2 `security.capability` granting CAP_SETUID. */
    uint32_t cap[5] = { 0x02000001, 1u << 7, 1u << 7, 0, 0 };
    say("setxattr-capability", setxattr(f, "security.capability", cap, sizeof cap, 0));
    /* Positive controls: modes without set-id bits. */
    say("control-chmod-0755", syscall(SYS_chmod, f, 0755));
    say("control-chmod-0644", syscall(SYS_chmod, f, 0644));
    say("control-chmod-1777", syscall(SYS_chmod, f, 01777));
    say("control-fchmod-0600", syscall(SYS_fchmod, fd, 0600));
    say("control-fchmodat2-0700", syscall(452, AT_FDCWD, f, 0700, 0));
    say("control-mkdir-0755", syscall(SYS_mkdir, at(dir, "d-control"), 0755));
    say("control-open-creat-0644", syscall(SYS_openat, AT_FDCWD, at(dir, "o-control"), O_CREAT | O_WRONLY, 0644));
    say("control-mknod-fifo", syscall(SYS_mknodat, AT_FDCWD, at(dir, "n-fifo"), S_IFIFO | 0644, 0));
    /* A mode argument open ignores (no O_CREAT): not refused. */
    say("control-open-rdonly-mode", syscall(SYS_openat, AT_FDCWD, f, O_RDONLY, 04755));
    return 0;
}

/* Terminal ioctls on fd 0 (a PTY job's terminal). */
static int tty(void) {
    int ldisc = 0; /* N_TTY, the one it has: a change to nothing */
    say("TIOCSETD", ioctl(0, TIOCSETD, &ldisc));
    char c = 0;
    say("TIOCSTI", ioctl(0, TIOCSTI, &c));
    char sub = 0; /* TIOCLINUX with a bad subcode */
    say("TIOCLINUX", ioctl(0, TIOCLINUX, &sub));
    say("TIOCCONS", ioctl(0, TIOCCONS));
    char serial[128] = {0};
    say("TIOCSSERIAL", ioctl(0, TIOCSSERIAL, serial));
    /* The command in the upper word, which the kernel ignores. */
    say("TIOCSETD-upper-word", syscall(SYS_ioctl, 0, (1UL << 32) | TIOCSETD, &ldisc));
    int got = -1;
    say("control-TIOCGETD", ioctl(0, TIOCGETD, &got));
    struct winsize ws;
    say("control-TIOCGWINSZ", ioctl(0, TIOCGWINSZ, &ws));
    struct termios t;
    say("control-tcgetattr", tcgetattr(0, &t));
    say("control-tcsetattr", tcsetattr(0, TCSANOW, &t));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 3 && !strcmp(argv[1], "setid")) return setid(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "tty")) return tty();
    return 2;
}
