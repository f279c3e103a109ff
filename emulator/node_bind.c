/* An emulated node's own network stack, for wildcard binds.
 *
 * On AWS every instance has its own network stack: a server that binds the wildcard address
 * (0.0.0.0 or ::) on one node takes that port on that node only. Emulated nodes are processes
 * of one host, each on its own 127.20.x.y address, so a wildcard bind on one node would take
 * the port on every node. TensorFlow's gRPC server always binds 0.0.0.0:<port> (it has no
 * bind-address setting), so two nodes' TF_CONFIG tasks on the same port (what dl-run's tf
 * launcher writes, right on AWS) would collide here.
 *
 * Preloaded into a process (LD_PRELOAD), this turns a bind to the wildcard address into a
 * bind to the node's own address, DEEPLEARNING_NODE_ADDR (the product sets it for every rank):
 * what the wildcard reaches on an instance whose one private address is that. An IPv6
 * wildcard becomes the IPv4-mapped form of the address (a dual-stack socket). Every other
 * bind, and every bind without that variable, goes through unchanged.
 *
 * A process whose host name is an EC2 host name of the form ip-a-b-c-d (an emulated node's
 * Slurm daemons and the tasks they start run in a UTS namespace named so) takes a.b.c.d as
 * its node's address, whatever DEEPLEARNING_NODE_ADDR says: the host name is the machine a
 * process is on, while a Slurm task's environment is its submitter's (sbatch exports it
 * all), whose DEEPLEARNING_NODE_ADDR names the node the user submitted from, not the one the
 * task landed on. DEEPLEARNING_NODE_ADDR is read only where the host name is not a node's.
 *
 * With DEEPLEARNING_NODE_CONNECT=1 as well, a socket that connects before it was bound is
 * first bound to the node's address (port 0; a dual-stack IPv6 socket to an IPv4-mapped peer
 * to the mapped form of it): its connections leave from the node's own
 * address, as an instance's leave from its private address, instead of from 127.0.0.1 (the
 * kernel's choice for every loopback destination). Slurm's controller records a dynamic
 * node's address from the connection its slurmd registers on.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The node's address: the one an ip-a-b-c-d host name names, else DEEPLEARNING_NODE_ADDR. */
static int node_address(struct in_addr *out) {
    char host[256];
    unsigned a, b, c, d;
    char tail;
    if (gethostname(host, sizeof host) == 0) {
        host[sizeof host - 1] = '\0';
        if (sscanf(host, "ip-%u-%u-%u-%u%c", &a, &b, &c, &d, &tail) == 4
            && a <= 255 && b <= 255 && c <= 255 && d <= 255) {
            out->s_addr = htonl((a << 24) | (b << 16) | (c << 8) | d);
            return 1;
        }
    }
    const char *node = getenv("DEEPLEARNING_NODE_ADDR");
    return node != NULL && inet_pton(AF_INET, node, out) == 1;
}

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (real_bind == NULL) {
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    }
    struct in_addr v4;
    if (addr == NULL || !node_address(&v4)) {
        return real_bind(fd, addr, len);
    }
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            a.sin_addr = v4;
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
            memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
            a.sin6_addr.s6_addr[10] = 0xff;
            a.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&a.sin6_addr.s6_addr[12], &v4, 4);
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real_bind(fd, addr, len);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static connect_fn real_connect;
    if (real_connect == NULL) {
        real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    }
    const char *wanted = getenv("DEEPLEARNING_NODE_CONNECT");
    struct in_addr v4;
    if (addr == NULL || wanted == NULL || strcmp(wanted, "1") != 0 || !node_address(&v4)) {
        return real_connect(fd, addr, len);
    }
    if (addr->sa_family == AF_INET) {
        struct sockaddr_in mine;
        socklen_t mine_len = sizeof mine;
        if (getsockname(fd, (struct sockaddr *)&mine, &mine_len) == 0
            && mine.sin_family == AF_INET && mine.sin_port == 0
            && mine.sin_addr.s_addr == htonl(INADDR_ANY)) {
            memset(&mine, 0, sizeof mine);
            mine.sin_family = AF_INET;
            mine.sin_addr = v4;
            /* a failure leaves the socket unbound: the kernel's own choice, as without us */
            (void)bind(fd, (const struct sockaddr *)&mine, sizeof mine);
        }
    } else if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        /* A dual-stack socket to an IPv4 peer (::ffff:a.b.c.d), as PyTorch's TCPStore
         * client connects: it leaves from the node's address in the same mapped form. */
        struct sockaddr_in6 peer;
        memcpy(&peer, addr, sizeof peer);
        struct sockaddr_in6 mine;
        socklen_t mine_len = sizeof mine;
        if (IN6_IS_ADDR_V4MAPPED(&peer.sin6_addr)
            && getsockname(fd, (struct sockaddr *)&mine, &mine_len) == 0
            && mine.sin6_family == AF_INET6 && mine.sin6_port == 0
            && IN6_IS_ADDR_UNSPECIFIED(&mine.sin6_addr)) {
            memset(&mine, 0, sizeof mine);
            mine.sin6_family = AF_INET6;
            mine.sin6_addr.s6_addr[10] = 0xff;
            mine.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&mine.sin6_addr.s6_addr[12], &v4, 4);
            (void)bind(fd, (const struct sockaddr *)&mine, sizeof mine);
        }
    }
    return real_connect(fd, addr, len);
}
