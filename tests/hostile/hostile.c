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
#include <sys/stat.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/inotify.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/fs.h>

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


static int tcp_addr(int fam, int port, struct sockaddr_storage *ss) {
    memset(ss, 0, sizeof *ss);
    if (fam == AF_INET6) {
        struct sockaddr_in6 *a = (void *)ss;
        a->sin6_family = AF_INET6; a->sin6_port = htons(port); a->sin6_addr = in6addr_loopback;
        return sizeof *a;
    }
    struct sockaddr_in *a = (void *)ss;
    a->sin_family = AF_INET; a->sin_port = htons(port); a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return sizeof *a;
}

static struct sockaddr_un unix_addr(const char *path) {
    struct sockaddr_un a = {0};
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    return a;
}

/* sendmsg of one byte on a fresh socketpair of `type`, naming `path`. */
static int pair_sendmsg(int type, const char *path, int sv[2]) {
    if (socketpair(AF_UNIX, type, 0, sv) < 0) return -1;
    struct sockaddr_un a = unix_addr(path);
    struct iovec iov = {"x", 1};
    struct msghdr m = {0};
    m.msg_name = &a; m.msg_namelen = sizeof a; m.msg_iov = &iov; m.msg_iovlen = 1;
    return sendmsg(sv[0], &m, 0);
}

static int more(int argc, char **argv) {
    const char *c = argv[1];
    /* A datagram to a pathname socket, three ways. */
    if (!strcmp(c, "dgram-sendto")) {
        int s = socket(AF_UNIX, SOCK_DGRAM, 0);
        if (s < 0) return report(-1);
        struct sockaddr_un a = unix_addr(argv[2]);
        return report(sendto(s, "x", 1, 0, (void *)&a, sizeof a));
    }
    if (!strcmp(c, "dgram-sendmsg")) { int sv[2]; return report(pair_sendmsg(SOCK_DGRAM, argv[2], sv)); }
    if (!strcmp(c, "seqpacket-sendmsg")) {
        int sv[2];
        /* The name is ignored for a connected seqpacket pair: the byte goes
           to the peer, which must have it. */
        if (pair_sendmsg(SOCK_SEQPACKET, argv[2], sv) < 0) return report(-1);
        char b; return report(recv(sv[1], &b, 1, MSG_DONTWAIT));
    }
    if (!strcmp(c, "seqpacket-connect")) {
        int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        if (s < 0) return report(-1);
        struct sockaddr_un a = unix_addr(argv[2]);
        return report(connect(s, (void *)&a, sizeof a));
    }
    /* SysV IPC by key. */
    if (!strcmp(c, "shm-write")) {
        int id = shmget(atoi(argv[2]), 0, 0);
        if (id < 0) return report(-1);
        char *p = shmat(id, 0, 0);
        if (p == (void *)-1) return report(-1);
        strcpy(p, "written by the job");
        return report(0);
    }
    if (!strcmp(c, "shm-create")) return report(shmget(atoi(argv[2]), 4096, IPC_CREAT | 0600));
    if (!strcmp(c, "msg-create")) return report(msgget(atoi(argv[2]), IPC_CREAT | 0600));
    if (!strcmp(c, "sem-create")) return report(semget(atoi(argv[2]), 1, IPC_CREAT | 0600));
    if (!strcmp(c, "msg-send")) {
        int id = msgget(atoi(argv[2]), 0);
        if (id < 0) return report(-1);
        struct { long t; char b[4]; } m = {1, "hi"};
        return report(msgsnd(id, &m, sizeof m.b, IPC_NOWAIT));
    }
    if (!strcmp(c, "sem-bump")) {
        int id = semget(atoi(argv[2]), 0, 0);
        if (id < 0) return report(-1);
        struct sembuf op = {0, 1, IPC_NOWAIT};
        return report(semop(id, &op, 1));
    }
    /* TCP past a port list. */
    if (!strcmp(c, "mptcp")) {
        struct sockaddr_storage ss; int len = tcp_addr(AF_INET, atoi(argv[2]), &ss);
        int s = socket(AF_INET, SOCK_STREAM, 262 /* IPPROTO_MPTCP */);
        if (s < 0) return report(-1);
        return report(connect(s, (void *)&ss, len));
    }
    if (!strcmp(c, "fastopen") || !strcmp(c, "fastopen6")) {
        int fam = c[8] == '6' ? AF_INET6 : AF_INET;
        struct sockaddr_storage ss; int len = tcp_addr(fam, atoi(argv[2]), &ss);
        int s = socket(fam, SOCK_STREAM, 0);
        if (s < 0) return report(-1);
        return report(sendto(s, "x", 1, MSG_FASTOPEN, (void *)&ss, len));
    }
    if (!strcmp(c, "fastopen-sendmsg")) {
        struct sockaddr_storage ss; int len = tcp_addr(AF_INET, atoi(argv[2]), &ss);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) return report(-1);
        struct iovec iov = {"x", 1};
        struct msghdr m = {0};
        m.msg_name = &ss; m.msg_namelen = len; m.msg_iov = &iov; m.msg_iovlen = 1;
        return report(sendmsg(s, &m, MSG_FASTOPEN));
    }
    if (!strcmp(c, "fastopen-connect")) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) return report(-1);
        int one = 1;
        return report(setsockopt(s, IPPROTO_TCP, 30 /* TCP_FASTOPEN_CONNECT */, &one, sizeof one));
    }
    if (!strcmp(c, "connect6")) {
        struct sockaddr_storage ss; int len = tcp_addr(AF_INET6, atoi(argv[2]), &ss);
        int s = socket(AF_INET6, SOCK_STREAM, 0);
        if (s < 0) return report(-1);
        return report(connect(s, (void *)&ss, len));
    }
    /* Other syscall ABIs. */
    if (!strcmp(c, "x32")) return report(syscall(0x40000000 | 272 /* unshare */, CLONE_NEWUSER));
    /* clone3 with a size the kernel refuses (EINVAL): the sandbox answers
       ENOSYS before the kernel looks, so libc falls back to clone, whose
       flags seccomp can read. */
    if (!strcmp(c, "clone3")) return report(syscall(435 /* clone3 */, NULL, 0));
    if (!strcmp(c, "int80")) {
        long r;
        __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L /* i386 getpid */) : "memory");
        if (r < 0) { errno = -r; return report(-1); }
        return report(0);
    }
    /* Watching and renaming. */
    if (!strcmp(c, "inotify")) {
        int fd = inotify_init1(0);
        if (fd < 0) return report(-1);
        return report(inotify_add_watch(fd, argv[2], IN_ALL_EVENTS));
    }
    if (!strcmp(c, "exchange")) return report(syscall(SYS_renameat2, AT_FDCWD, argv[2], AT_FDCWD, argv[3], RENAME_EXCHANGE));
    if (!strcmp(c, "rename")) return report(rename(argv[2], argv[3]));
    if (!strcmp(c, "rmdir")) return report(rmdir(argv[2]));
    if (!strcmp(c, "unlink")) return report(unlink(argv[2]));
    if (!strcmp(c, "mkdir")) return report(mkdir(argv[2], 0755));
    if (!strcmp(c, "open-read")) return report(open(argv[2], O_RDONLY));
    return 2;
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
    /* Without OPEN_TREE_CLONE both are an O_PATH open: the kernel allows it
       to anyone; seccomp refuses the mount API as a whole. */
    if (!strcmp(c, "open_tree")) return report(syscall(428 /* open_tree */, AT_FDCWD, "/tmp", O_CLOEXEC));
    if (!strcmp(c, "open_tree_attr")) return report(syscall(467 /* open_tree_attr */, AT_FDCWD, "/tmp", O_CLOEXEC, 0, 0));
    if (!strcmp(c, "kexec")) return report(syscall(SYS_kexec_load, 0, 0, 0, 0));
    if (!strcmp(c, "init_module")) return report(syscall(SYS_init_module, "", 0, ""));
    if (!strcmp(c, "io_uring")) return report(syscall(SYS_io_uring_setup, 1, calloc(1, 256)));
    if (!strcmp(c, "pidfd_getfd")) {
        /* Copy in a descriptor of another process (here our own stdin). */
        long pfd = syscall(434 /* pidfd_open */, getpid(), 0);
        if (pfd < 0) return report(-1);
        return report(syscall(438 /* pidfd_getfd */, (int)pfd, 0, 0));
    }
    return more(argc, argv);
}
