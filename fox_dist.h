/*
fox_dist.h: the plain-C side of data-parallel training (one process per GPU), shared by
train_fox.cu and the tests: the process's rank, world size and local rank (from flags or the
launcher's environment) and the exchange of the NCCL unique id through a shared file or a TCP rendezvous (a saved data
position is translated to another process count by train_fox.c's resume_data_position). No CUDA
or NCCL here.
Included after train_fox.c, whose fail() and now_seconds() it uses.
*/
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#define RENDEZVOUS_TIMEOUT_S 300

// ----------------------------------------------------------------------------
// who am I: flags win over the environment; the environment names of Open MPI, Slurm and
// torchrun-style launchers are read in that order

typedef struct {
    int rank, world;
    int local_rank; // rank among the processes of this node: picks the GPU
} Topology;

static const char* const WORLD_ENV[] = {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "WORLD_SIZE"};
static const char* const RANK_ENV[] = {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK"};
static const char* const LOCAL_RANK_ENV[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"};

// the value of the first of `names` that is set (its name in *which), or -1 when none is
static long env_first_int(const char* const* names, int n, const char** which) {
    for (int i = 0; i < n; i++) {
        const char* v = getenv(names[i]);
        if (v == NULL || v[0] == '\0') { continue; }
        long x;
        if (!parse_int_strict(v, &x) || x < 0 || x > (1 << 20)) {
            fail("environment variable %s=%s is not a process count or rank\nHINT: unset it, or pass -W and -I",
                 names[i], v);
        }
        *which = names[i];
        return x;
    }
    return -1;
}

// flag_world < 1 and flag_rank < 0 mean "not given". The local rank comes from the launcher
// that gave the rank; with -I it is the rank (one node, or GPUs picked modulo their count).
static void resolve_topology(Topology* t, int flag_world, int flag_rank) {
    const char* world_from = "-W";
    const char* rank_from = "-I";
    const char* local_from = "";
    long world = flag_world >= 1 ? flag_world : env_first_int(WORLD_ENV, 3, &world_from);
    if (world < 0) { world = 1; world_from = "default"; }
    if (world == 0) { fail("a world of 0 processes (from %s)\nHINT: the process count is at least 1", world_from); }
    long rank = flag_rank >= 0 ? flag_rank : env_first_int(RANK_ENV, 3, &rank_from);
    if (rank < 0) {
        if (world > 1) {
            fail("%ld processes (from %s) but no rank for this one\n"
                 "HINT: pass -I <rank> to each process, or launch with mpirun / srun",
                 world, world_from);
        }
        rank = 0;
    }
    if (rank >= world) {
        fail("rank %ld (from %s) is not below the world size %ld (from %s)\n"
             "HINT: ranks run from 0 to world-1; check -I and -W",
             rank, rank_from, world, world_from);
    }
    long local = flag_rank >= 0 ? -1 : env_first_int(LOCAL_RANK_ENV, 3, &local_from);
    t->world = (int)world;
    t->rank = (int)rank;
    t->local_rank = local >= 0 ? (int)local : (int)rank;
}

// ----------------------------------------------------------------------------
// rendezvous: rank 0 hands its NCCL unique id to the others. "-F tcp://host:port": rank 0
// listens on port, the others connect to host:port. "-F <path>" on a filesystem all
// processes share: rank 0 writes the id atomically, each other rank reads it and leaves an
// acknowledgement file "<path>.ack<rank>"; rank 0 waits for all of them (so a missing
// process is reported instead of hanging in NCCL's init) and removes the files after init.

// 1 with host and port filled for "tcp://host:port", 0 for a file path
static int rendezvous_is_tcp(const char* spec, char* host, size_t host_size, int* port) {
    if (strncmp(spec, "tcp://", 6) != 0) { return 0; }
    const char* hp = spec + 6;
    const char* colon = strrchr(hp, ':');
    long p;
    if (colon == NULL || colon == hp || (size_t)(colon - hp) >= host_size || !parse_int_strict(colon + 1, &p)
        || p < 1 || p > 65535) {
        fail("-F %s: expected tcp://<host of rank 0>:<port 1-65535>\n"
             "HINT: e.g. -F tcp://node001:29500, or a file path on a shared filesystem", spec);
    }
    memcpy(host, hp, (size_t)(colon - hp));
    host[colon - hp] = '\0';
    *port = (int)p;
    return 1;
}

static void rendezvous_ack_path(const char* path, int rank, char* out, size_t n) {
    if ((size_t)snprintf(out, n, "%s.ack%d", path, rank) >= n) {
        fail("rendezvous path too long: '%s'\nHINT: pass a shorter -F path", path);
    }
}

static void rendezvous_file_cleanup(const char* path, int world) {
    char ack[4096];
    unlink(path);
    for (int r = 1; r < world; r++) { rendezvous_ack_path(path, r, ack, sizeof(ack)); unlink(ack); }
}

static void rendezvous_file_publish(const char* path, const void* id, size_t n, int world) {
    if (access(path, F_OK) == 0) {
        fail("rendezvous file '%s' already exists, probably left by a run that crashed\n"
             "HINT: delete it, or pass a fresh path to -F (e.g. with the job id in it)", path);
    }
    char ack[4096];
    for (int r = 1; r < world; r++) { rendezvous_ack_path(path, r, ack, sizeof(ack)); unlink(ack); }
    char tmp[4096];
    FILE* f = atomic_open(path, tmp, sizeof(tmp));
    fwrite_check(id, 1, n, f, tmp);
    atomic_commit(f, tmp, path);
}

static void rendezvous_file_await_acks(const char* path, int world, double timeout_s) {
    double start = now_seconds();
    for (;;) {
        int missing = 0, first_missing = -1;
        char ack[4096];
        for (int r = 1; r < world; r++) {
            rendezvous_ack_path(path, r, ack, sizeof(ack));
            if (access(ack, F_OK) != 0) { missing++; if (first_missing < 0) { first_missing = r; } }
        }
        if (missing == 0) { return; }
        if (now_seconds() - start > timeout_s) {
            rendezvous_file_cleanup(path, world);
            fail("rank 0 waited %g s at rendezvous '%s': %d of %d processes never joined "
                 "(the first missing is rank %d)\n"
                 "HINT: start every process with the same -W and -F and its own -I; "
                 "the path must be on a filesystem they all see",
                 timeout_s, path, missing, world - 1, first_missing);
        }
        usleep(20000);
    }
}

static void rendezvous_file_fetch(const char* path, void* id, size_t n, int rank, double timeout_s) {
    double start = now_seconds();
    for (;;) {
        struct stat st;
        if (stat(path, &st) == 0 && (size_t)st.st_size == n) { break; }
        if (now_seconds() - start > timeout_s) {
            fail("rank %d waited %g s for rank 0 to write the rendezvous file '%s'\n"
                 "HINT: start rank 0 with the same -F; the path must be on a filesystem all processes see",
                 rank, timeout_s, path);
        }
        usleep(20000);
    }
    FILE* f = fopen_check(path, "rb");
    fread_check(id, 1, n, f, path);
    fclose(f);
    char ack[4096];
    rendezvous_ack_path(path, rank, ack, sizeof(ack));
    FILE* a = fopen_check(ack, "wb");
    if (fclose(a) != 0) {
        fail("could not write '%s': %s\nHINT: every process must be able to write in the -F path's directory", ack,
             strerror(errno));
    }
}

// sends or receives exactly n bytes; 0 on a closed or broken connection
static int socket_send_all(int fd, const void* buf, size_t n) {
    const char* p = (const char*)buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) { if (k < 0 && errno == EINTR) { continue; } return 0; }
        p += k; n -= (size_t)k;
    }
    return 1;
}

static int socket_recv_all(int fd, void* buf, size_t n) {
    char* p = (char*)buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k <= 0) { if (k < 0 && errno == EINTR) { continue; } return 0; }
        p += k; n -= (size_t)k;
    }
    return 1;
}

// a peer that connects and then says nothing must not block the rendezvous
static void socket_set_timeout(int fd, int seconds) {
    struct timeval tv = {seconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// a socket listening on port on every address: IPv6 dual stack (IPv4 peers too), else IPv4
static int listen_any(int port, int backlog) {
    int one = 1, zero = 0;
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
        struct sockaddr_in6 addr;
        memset(&addr, 0, sizeof(addr));
        addr.sin6_family = AF_INET6; addr.sin6_addr = in6addr_any; addr.sin6_port = htons((uint16_t)port);
        if (bind(fd, (struct sockaddr*)&addr, sizeof(addr)) == 0 && listen(fd, backlog) == 0) { return fd; }
        close(fd);
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        fail("rendezvous: could not open a socket: %s\nHINT: use a -F file path all processes see instead",
             strerror(errno));
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET; addr.sin_addr.s_addr = htonl(INADDR_ANY); addr.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr*)&addr, sizeof(addr)) != 0 || listen(fd, backlog) != 0) {
        fail("rendezvous: rank 0 could not listen on port %d: %s\nHINT: pick a free port in -F tcp://host:port", port,
             strerror(errno));
    }
    return fd;
}

// rank 0: accepts one connection from every other rank (each sends its rank as an int32)
// and sends each the id
static void rendezvous_tcp_serve(int port, const void* id, size_t n, int world, double timeout_s) {
    int fd = listen_any(port, world);
    char* joined = (char*)calloc_check((size_t)world, 1, "rendezvous ranks");
    int remaining = world - 1;
    double start = now_seconds();
    while (remaining > 0) {
        double left = timeout_s - (now_seconds() - start);
        struct pollfd pfd = {fd, POLLIN, 0};
        int ready = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
        if (ready < 0 && errno == EINTR) { continue; }
        if (ready <= 0) {
            int first = 1;
            while (first < world && joined[first]) { first++; }
            fail("rank 0 waited %g s on port %d: %d of %d processes never joined (the first missing is rank %d)\n"
                 "HINT: start every process with the same -W and -F and its own -I; "
                 "the host in -F must be rank 0's, reachable from all",
                 timeout_s, port, remaining, world - 1, first);
        }
        int c = accept(fd, NULL, NULL);
        if (c < 0) { continue; }
        socket_set_timeout(c, 10);
        int32_t r = -1;
        if (socket_recv_all(c, &r, sizeof(r)) && r >= 1 && r < world && !joined[r] && socket_send_all(c, id, n)) {
            joined[r] = 1;
            remaining--;
        } else if (r >= 1 && r < world && joined[r]) {
            fail("rendezvous: two processes claim rank %d\nHINT: give each process its own -I", (int)r);
        }
        close(c);
    }
    free(joined);
    close(fd);
}

// ranks > 0: connects to rank 0 (retrying while it is not listening yet) and receives the id
static void rendezvous_tcp_fetch(const char* host, int port, void* id, size_t n, int rank, double timeout_s) {
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    double start = now_seconds();
    for (;;) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC; hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(host, port_s, &hints, &res);
        if (gai != 0) {
            fail("rendezvous: cannot resolve '%s': %s\n"
                 "HINT: the host in -F tcp://host:port must be rank 0's name or address", host, gai_strerror(gai));
        }
        for (struct addrinfo* ai = res; ai != NULL; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (fd < 0) { continue; }
            socket_set_timeout(fd, 10);
            int32_t r = rank;
            int got = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && socket_send_all(fd, &r, sizeof(r)) &&
                      socket_recv_all(fd, id, n);
            close(fd);
            if (got) { freeaddrinfo(res); return; }
        }
        freeaddrinfo(res);
        if (now_seconds() - start > timeout_s) {
            fail("rank %d could not get the NCCL id from %s:%d within %g s\n"
                 "HINT: start rank 0 with the same -F; check the host name, the port and the firewall",
                 rank, host, port, timeout_s);
        }
        usleep(100000);
    }
}
