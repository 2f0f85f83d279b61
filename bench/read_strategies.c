// Raw page-cache read strategies for bench/bench_read_strategies.py (benchmark only, never part of the loader):
// threads calling pread, threads copying from an mmap, and one io_uring, each reading every shard into
// caller-owned buffers so the rates show what the kernel can deliver without Python in the way.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

typedef struct {
    int nfiles;
    const int *fds;
    const long *sizes;
    long chunk;
    void **bufs;
    atomic_long next;
    long total_chunks;
    long *starts;  // chunk index where file i begins
    int mode;      // 0 pread, 1 mmap memcpy
    char **maps;
    atomic_long err;
} job_t;

static void *worker(void *arg_) {
    void **a = arg_;
    job_t *j = a[0];
    long t = (long)a[1];
    char *buf = j->bufs[t];
    for (;;) {
        long c = atomic_fetch_add(&j->next, 1);
        if (c >= j->total_chunks) break;
        int f = 0;
        while (f + 1 < j->nfiles && j->starts[f + 1] <= c) f++;
        long off = (c - j->starts[f]) * j->chunk;
        long n = j->sizes[f] - off < j->chunk ? j->sizes[f] - off : j->chunk;
        if (j->mode == 0) {
            long done = 0;
            while (done < n) {
                ssize_t r = pread(j->fds[f], buf + done, n - done, off + done);
                if (r <= 0) { atomic_store(&j->err, r < 0 ? -errno : -1); return NULL; }
                done += r;
            }
        } else {
            memcpy(buf, j->maps[f] + off, n);
        }
    }
    return NULL;
}

long read_threads(int nfiles, const int *fds, const long *sizes, int threads, long chunk, void **bufs, int mode) {
    job_t j = {nfiles, fds, sizes, chunk, bufs, 0, 0, NULL, mode, NULL, 0};
    j.starts = calloc((size_t)(nfiles > 0 ? nfiles + 1 : 1), sizeof(long));
    for (int i = 0; i < nfiles; i++) {
        j.starts[i] = j.total_chunks;
        j.total_chunks += (sizes[i] + chunk - 1) / chunk;
    }
    if (mode == 1) {
        j.maps = calloc((size_t)(nfiles > 0 ? nfiles : 1), sizeof(char *));
        for (int i = 0; i < nfiles; i++) {
            j.maps[i] = mmap(NULL, sizes[i], PROT_READ, MAP_SHARED, fds[i], 0);
            if (j.maps[i] == MAP_FAILED) return -errno;
        }
    }
    pthread_t th[256];
    void *args[256][2];
    for (long t = 0; t < threads; t++) {
        args[t][0] = &j;
        args[t][1] = (void *)t;
        pthread_create(&th[t], NULL, worker, args[t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    if (mode == 1)
        for (int i = 0; i < nfiles; i++) munmap(j.maps[i], sizes[i]);
    free(j.starts);
    return atomic_load(&j.err);
}

// io_uring, one ring, `depth` reads in flight, each into its own buffer; flags bit0: IOSQE_ASYNC, bit1: READ_FIXED.
static int sys_setup(unsigned e, struct io_uring_params *p) { return syscall(__NR_io_uring_setup, e, p); }
static int sys_enter(int fd, unsigned sub, unsigned minc, unsigned fl) {
    return syscall(__NR_io_uring_enter, fd, sub, minc, fl, NULL, 0);
}
static int sys_register(int fd, unsigned op, void *arg, unsigned n) {
    return syscall(__NR_io_uring_register, fd, op, arg, n);
}

long read_uring(int nfiles, const int *fds, const long *sizes, int depth, long chunk, void **bufs, int flags) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int rfd = sys_setup(depth * 2, &p);
    if (rfd < 0) return -errno;
    size_t sqsz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cqsz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    char *sq = mmap(NULL, sqsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, rfd, IORING_OFF_SQ_RING);
    char *cq = mmap(NULL, cqsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, rfd, IORING_OFF_CQ_RING);
    struct io_uring_sqe *sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                                     MAP_SHARED | MAP_POPULATE, rfd, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) return -errno;
    unsigned *sq_tail = (unsigned *)(sq + p.sq_off.tail), *sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    unsigned *sq_array = (unsigned *)(sq + p.sq_off.array);
    unsigned *cq_head = (unsigned *)(cq + p.cq_off.head), *cq_tail = (unsigned *)(cq + p.cq_off.tail);
    unsigned *cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    struct io_uring_cqe *cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    if (flags & 2) {
        struct iovec *iov = calloc(depth, sizeof *iov);
        for (int i = 0; i < depth; i++) { iov[i].iov_base = bufs[i]; iov[i].iov_len = chunk; }
        if (sys_register(rfd, IORING_REGISTER_BUFFERS, iov, depth) < 0) return -1000 - errno;
        free(iov);
    }
    // chunk queue
    int f = 0;
    long off = 0;
    long inflight = 0, err = 0;
    int *freebuf = malloc(depth * sizeof(int));
    int nfree = depth;
    for (int i = 0; i < depth; i++) freebuf[i] = i;
    for (;;) {
        unsigned tail = *sq_tail, queued = 0;
        while (nfree > 0 && f < nfiles) {
            int b = freebuf[--nfree];
            long n = sizes[f] - off < chunk ? sizes[f] - off : chunk;
            unsigned idx = tail & *sq_mask;
            struct io_uring_sqe *s = &sqes[idx];
            memset(s, 0, sizeof *s);
            s->opcode = (flags & 2) ? IORING_OP_READ_FIXED : IORING_OP_READ;
            s->fd = fds[f];
            s->off = off;
            s->addr = (uint64_t)bufs[b];
            s->len = n;
            s->buf_index = b;
            s->flags = (flags & 1) ? IOSQE_ASYNC : 0;
            s->user_data = ((uint64_t)b << 32) | (uint64_t)n;
            sq_array[idx] = idx;
            tail++;
            queued++;
            off += n;
            if (off >= sizes[f]) { f++; off = 0; }
        }
        atomic_store_explicit((_Atomic unsigned *)sq_tail, tail, memory_order_release);
        inflight += queued;
        if (inflight == 0) break;
        if (sys_enter(rfd, queued, 1, IORING_ENTER_GETEVENTS) < 0) { err = -errno; break; }
        unsigned head = *cq_head;
        unsigned ctail = atomic_load_explicit((_Atomic unsigned *)cq_tail, memory_order_acquire);
        while (head != ctail) {
            struct io_uring_cqe *c = &cqes[head & *cq_mask];
            if (c->res != (int)(c->user_data & 0xffffffff)) err = c->res < 0 ? c->res : -2;
            freebuf[nfree++] = (int)(c->user_data >> 32);
            head++;
            inflight--;
        }
        atomic_store_explicit((_Atomic unsigned *)cq_head, head, memory_order_release);
        if (err) break;
    }
    free(freebuf);
    close(rfd);
    return err;
}
