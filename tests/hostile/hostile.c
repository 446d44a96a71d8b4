/* A deliberately hostile helper for the sandbox escape suite: each
 * subcommand tries one thing and prints "ok" or "errno=N" (exit 0 either
 * way, so the test asserts the exact outcome). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <linux/bpf.h>
#include <linux/perf_event.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

static int report(long r) {
    if (r < 0) printf("errno=%d\n", errno); else printf("ok\n");
    return 0;
}

static int tcp(int port, int do_bind) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return report(-1);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return report(do_bind ? bind(s, (void *)&a, sizeof a) : connect(s, (void *)&a, sizeof a));
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *c = argv[1];
    if (!strcmp(c, "socket")) return report(socket(atoi(argv[2]), atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 0));
    if (!strcmp(c, "socketpair")) { int sv[2]; return report(socketpair(AF_UNIX, SOCK_STREAM, 0, sv)); }
    if (!strcmp(c, "connect")) return tcp(atoi(argv[2]), 0);
    if (!strcmp(c, "bind")) return tcp(atoi(argv[2]), 1);
    if (!strcmp(c, "udp")) {
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        if (s < 0) return report(-1);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET; a.sin_port = htons(atoi(argv[2])); a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return report(sendto(s, "x", 1, 0, (void *)&a, sizeof a));
    }
    if (!strcmp(c, "unix")) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s < 0) return report(-1);
        struct sockaddr_un a = {0};
        a.sun_family = AF_UNIX; strncpy(a.sun_path, argv[2], sizeof a.sun_path - 1);
        return report(connect(s, (void *)&a, sizeof a));
    }
    if (!strcmp(c, "kill")) return report(kill(atoi(argv[2]), 0));
    if (!strcmp(c, "ptrace")) return report(ptrace(PTRACE_ATTACH, atoi(argv[2]), 0, 0));
    if (!strcmp(c, "unshare-user")) return report(unshare(CLONE_NEWUSER));
    if (!strcmp(c, "unshare-ns")) return report(unshare(CLONE_NEWNS));
    if (!strcmp(c, "setns")) { int fd = open("/proc/self/ns/mnt", O_RDONLY); if (fd < 0) return report(-1); return report(setns(fd, 0)); }
    if (!strcmp(c, "clone-newuser")) {
        long r = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
        if (r == 0) _exit(0);
        if (r > 0) waitpid(r, 0, 0);
        return report(r);
    }
    if (!strcmp(c, "mount")) return report(mount("tmpfs", "/tmp", "tmpfs", 0, 0));
    if (!strcmp(c, "umount")) return report(umount2(argv[2], MNT_DETACH));
    if (!strcmp(c, "pivot_root")) return report(syscall(SYS_pivot_root, "/", "/"));
    if (!strcmp(c, "chroot")) return report(chroot("/"));
    if (!strcmp(c, "keyctl")) return report(syscall(SYS_keyctl, 0 /* GET_KEYRING_ID */, -3, 0));
    if (!strcmp(c, "add_key")) return report(syscall(SYS_add_key, "user", "k", "v", 1, -3));
    if (!strcmp(c, "bpf")) { union bpf_attr a; memset(&a, 0, sizeof a); return report(syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof a)); }
    if (!strcmp(c, "perf")) { struct perf_event_attr a; memset(&a, 0, sizeof a); a.size = sizeof a; a.type = PERF_TYPE_SOFTWARE; return report(syscall(SYS_perf_event_open, &a, 0, -1, -1, 0)); }
    if (!strcmp(c, "userfaultfd")) return report(syscall(SYS_userfaultfd, 0));
    if (!strcmp(c, "kexec")) return report(syscall(SYS_kexec_load, 0, 0, 0, 0));
    if (!strcmp(c, "init_module")) return report(syscall(SYS_init_module, "", 0, ""));
    if (!strcmp(c, "io_uring")) return report(syscall(SYS_io_uring_setup, 1, calloc(1, 256)));
    return 2;
}
