/*
 * hpccomm._arena: a NumPy data allocator that places large arrays in one nameless shared
 * file per process (the "arena"), so that the node's other ranks, which map that file once,
 * can read and write them in place (see hpccomm/arena.py for the Python side and why).
 *
 * NumPy (>= 1.22) lets a program replace the functions that allocate array data
 * (PyDataMem_SetHandler, NEP 49): a handler is a capsule named "mem_handler" holding a
 * PyDataMem_Handler (name, version 1, and malloc/calloc/realloc/free taking a context).
 * NumPy keeps the handler in a context variable (the calling thread's context) and every
 * array remembers the handler that allocated it, so frees come back here whatever is set
 * later. Requests of at least `min_bytes` go to the arena, the others (and those the arena
 * cannot hold) to the handler that was in force before (NumPy's default, with its cache of
 * small blocks).
 *
 * The arena: memfd_create + ftruncate to `reserve` bytes (sparse: pages exist once touched)
 * mapped shared once. Ranges are page multiples handed out best fit from a sorted free list
 * (lowest address among the smallest that fit), else from the untouched top. A freed range
 * keeps its pages (the next array of that size reuses them, and the peers' page tables
 * stay valid: no page faults on either side) while the freed bytes kept stay under
 * `keep_max`; beyond it the range's pages are given back (fallocate PUNCH_HOLE), as glibc
 * gives back a large block. Under strict overcommit (vm.overcommit_memory = 2) the pages of
 * a range are allocated when it is handed out (fallocate), so that a lack of memory is a
 * NULL (NumPy's MemoryError) instead of SIGBUS at first touch.
 *
 * Threads: the handler may be called without the GIL; one mutex guards the lists.
 * fork(): the child must not share its arrays with the parent (an ordinary array is private
 * after fork) nor hand out ranges the parent also hands out: in the child the used part of
 * the arena is mapped again copy-on-write (MAP_PRIVATE of the same file at the same
 * address), new requests go to the previous handler, and frees of arena ranges do nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif

/* NumPy's structures (numpy/ndarraytypes.h, version 1 of the handler: NEP 49) */
typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr, size_t size);
} Allocator;

typedef struct {
    char name[127];
    uint8_t version;
    Allocator allocator;
} Handler;

/* The indexes of PyDataMem_SetHandler and PyDataMem_GetHandler in NumPy's C-API table
 * (numpy/__multiarray_api.h, since NumPy 1.22; entries never move). */
#define API_SET_HANDLER 304
#define API_GET_HANDLER 305

typedef struct {
    size_t off, len;
    int backed; /* every page of the range is allocated in the file */
    int dirty;  /* the range may hold data (calloc must clear it) */
    int forked; /* in use when this process last forked: a child may still read it */
} Range;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Handler *prev;          /* the handler in force at enable() */
static PyObject *prev_capsule; /* (kept: prev lives as long as it does) */
static PyObject *capsule;      /* ours */
static Handler mine;
static void **api;             /* NumPy's C-API table */

static int fd = -1;
static char *base;
static size_t reserve, min_bytes, keep_max, top;
static pid_t owner;    /* the process that owns the arena (0: not enabled) */
static int prefault;   /* strict overcommit: allocate a range's pages when handed out */
static int in_child;   /* this process is a fork() child of the owner */
static int child_errno; /* the child's copy-on-write remap: 0, or why it failed */
static int child_shared; /* ... and then whether the arena is still mapped shared */

static Range *freel, *used, *quar;
static size_t nfree, capfree, nused, capused, nquar, capquar;
static unsigned long long n_alloc, n_fallback, n_punched, n_quarantined;
static size_t in_use, peak;

#define PAGE 4096UL

static size_t round_page(size_t n) { return (n + PAGE - 1) & ~(PAGE - 1); }

static int grow(Range **a, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    Range *b = realloc(*a, c * sizeof(Range));
    if (!b) return -1;
    *a = b;
    *cap = c;
    return 0;
}

/* index of the first range with off >= x */
static size_t lower(Range *a, size_t n, size_t x) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a[mid].off < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int insert_at(Range **a, size_t *n, size_t *cap, size_t i, Range r) {
    if (grow(a, cap, *n + 1)) return -1;
    memmove(*a + i + 1, *a + i, (*n - i) * sizeof(Range));
    (*a)[i] = r;
    (*n)++;
    return 0;
}

static void remove_at(Range *a, size_t *n, size_t i) {
    memmove(a + i, a + i + 1, (*n - i - 1) * sizeof(Range));
    (*n)--;
}

static int same_state(const Range *a, const Range *b) {
    return a->dirty == b->dirty && a->backed == b->backed;
}

/* put a range back on the free list, merged with its neighbours of the same state (pages
 * kept or given back): a range that keeps its pages stays one, so that the next array of its
 * size gets exactly it (merge_all joins the rest when nothing fits) */
static int give_back(Range r) {
    size_t i = lower(freel, nfree, r.off);
    if (i > 0 && freel[i - 1].off + freel[i - 1].len == r.off && same_state(&freel[i - 1], &r)) {
        Range *p = &freel[i - 1];
        p->len += r.len;
        if (i < nfree && p->off + p->len == freel[i].off && same_state(p, &freel[i])) {
            p->len += freel[i].len;
            remove_at(freel, &nfree, i);
        }
        return 0;
    }
    if (i < nfree && r.off + r.len == freel[i].off && same_state(&freel[i], &r)) {
        freel[i].off = r.off;
        freel[i].len += r.len;
        return 0;
    }
    return insert_at(&freel, &nfree, &capfree, i, r);
}

/* merge free range i with its adjacent neighbours in the same state (after its pages were
 * given back where it lies: clean now, like its punched neighbours) */
static void coalesce_at(size_t i) {
    if (i + 1 < nfree && freel[i].off + freel[i].len == freel[i + 1].off &&
        same_state(&freel[i], &freel[i + 1])) {
        freel[i].len += freel[i + 1].len;
        remove_at(freel, &nfree, i + 1);
    }
    if (i > 0 && freel[i - 1].off + freel[i - 1].len == freel[i].off &&
        same_state(&freel[i - 1], &freel[i])) {
        freel[i - 1].len += freel[i].len;
        remove_at(freel, &nfree, i);
    }
}

/* join every run of adjacent free ranges, whatever their state (pages kept: any part's;
 * allocated: every part's): before the arena grows for a request no range fits */
static void merge_all(void) {
    size_t k = 0;
    for (size_t i = 0; i < nfree; i++) {
        if (k > 0 && freel[k - 1].off + freel[k - 1].len == freel[i].off) {
            freel[k - 1].len += freel[i].len;
            freel[k - 1].backed = freel[k - 1].backed && freel[i].backed;
            freel[k - 1].dirty = freel[k - 1].dirty || freel[i].dirty;
        } else {
            freel[k++] = freel[i];
        }
    }
    nfree = k;
}

/* bytes of free ranges that may keep pages (merged ranges count whole: an upper bound) */
static size_t kept_bytes(void) {
    size_t s = 0;
    for (size_t i = 0; i < nfree; i++)
        if (freel[i].dirty) s += freel[i].len;
    return s;
}

static void punch_or_keep(Range r);

static ino_t file_ino; /* the arena's inode (looked for in children's mappings) */

/* Whether process `pid` maps the arena (a line with its inode in /proc/<pid>/maps: a fork()
 * child's copy-on-write arrays, or, until its at_child has run or where that failed, the
 * shared mapping it inherited); -1 where that cannot be read. */
static int maps_arena(const char *pid) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%.20s/maps", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long long ino;
        if (sscanf(line, "%*s %*s %*s %*s %llu", &ino) == 1 && (ino_t)ino == file_ino)
            found = 1;
        size_t n = strlen(line);
        while (n && line[n - 1] != '\n' && fgets(line, sizeof line, f)) n = strlen(line);
    }
    fclose(f);
    return found;
}

/* Whether a descendant of process `pid` (its children's, theirs, ... to `depth` levels; any
 * thread's) still maps the arena. 1 where /proc cannot be read (the safe answer). */
static int descendants_map(const char *pid, int depth) {
    char path[96], child[24];
    snprintf(path, sizeof path, "/proc/%.20s/task", pid);
    DIR *d = opendir(path);
    if (!d) return 1;
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/%.20s/task/%.20s/children", pid, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        while (!found && fscanf(f, "%23s", child) == 1) {
            int m = maps_arena(child);
            /* (a child gone meanwhile: -1, nothing of it to keep) */
            if (m == 1 || (depth > 1 && descendants_map(child, depth - 1))) found = 1;
        }
        fclose(f);
    }
    closedir(d);
    return found;
}

/* Whether some fork() child of this process, or a child of a child, still maps the arena:
 * then a range it inherited must not be handed out or punched. The answer is
 * kept 20 ms (a look opens a few /proc files per thread and child), until the next fork
 * (at_parent forgets it: the new child maps the arena). A child that has
 * called exec(), or exited, no longer maps it. A grandchild whose parent has exited is
 * another process's child (init's, or a subreaper's) and is not found. */
static struct timespec looked; /* when children_map last looked (zero: look now) */

static int children_map(void) {
    static int answer;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long ms = (now.tv_sec - looked.tv_sec) * 1000 + (now.tv_nsec - looked.tv_nsec) / 1000000;
    if (looked.tv_sec == 0 || ms >= 20 || ms < 0) {
        answer = descendants_map("self", 4);
        looked = now;
    }
    return answer;
}

/* Ranges freed while a fork() child that inherited them may still read them wait in
 * quarantine: handed out again, a child would see the new array's data in its copy of
 * the old one (its private mapping of the file shows the file's pages until it writes
 * them). They go back to the free list once no child maps the arena (children_map). Lock
 * held. */
static void release_quarantine(void) {
    if (!nquar || children_map()) return;
    size_t n = nquar;
    nquar = 0;
    for (size_t i = 0; i < n; i++) punch_or_keep(quar[i]);
}

/* the smallest free range of at least `len` bytes (the lowest of equals), or nfree */
static size_t best_fit(size_t len) {
    size_t best = nfree;
    for (size_t i = 0; i < nfree; i++)
        if (freel[i].len >= len && (best == nfree || freel[i].len < freel[best].len)) best = i;
    return best;
}

/* a range of `len` bytes (a page multiple), or NULL; *dirty says whether it may hold data.
 * Called with the lock held. */
static char *take(size_t len, int *dirty) {
    release_quarantine();
    size_t best = best_fit(len);
    if (best == nfree && len > reserve - top) {
        merge_all();
        best = best_fit(len);
    }
    Range r;
    if (best < nfree) {
        Range *f = &freel[best];
        r = (Range){f->off, len, f->backed, f->dirty, 0};
        if (f->len == len) remove_at(freel, &nfree, best);
        else { f->off += len; f->len -= len; }
    } else if (len <= reserve - top) {
        r = (Range){top, len, 0, 0, 0};
        top += len;
    } else {
        return NULL;
    }
    if (prefault && !r.backed && fallocate(fd, 0, (off_t)r.off, (off_t)r.len) != 0) {
        give_back(r);
        return NULL;
    }
    r.backed = 1;
    if (insert_at(&used, &nused, &capused, lower(used, nused, r.off), r)) {
        give_back(r);
        return NULL;
    }
    *dirty = r.dirty;
    in_use += len;
    if (in_use > peak) peak = in_use;
    n_alloc++;
    return base + r.off;
}

static int ours(void *p) {
    return base && (char *)p >= base && (char *)p < base + reserve;
}

/* the used range starting at p (lock held), or nused */
static size_t find_used(void *p) {
    size_t off = (size_t)((char *)p - base);
    size_t i = lower(used, nused, off);
    return (i < nused && used[i].off == off) ? i : nused;
}

static void *arena_malloc_flags(size_t size, int *dirty) {
    if (size < min_bytes || owner == 0 || in_child || size > reserve) return NULL;
    pthread_mutex_lock(&lock);
    char *p = take(round_page(size), dirty);
    if (!p) n_fallback++;
    pthread_mutex_unlock(&lock);
    return p;
}

static void *h_malloc(void *ctx, size_t size) {
    (void)ctx;
    int dirty;
    void *p = arena_malloc_flags(size, &dirty);
    return p ? p : prev->allocator.malloc(prev->allocator.ctx, size);
}

static void *h_calloc(void *ctx, size_t nelem, size_t elsize) {
    (void)ctx;
    if (elsize && nelem > SIZE_MAX / elsize) return NULL;
    size_t size = nelem * elsize;
    int dirty;
    void *p = arena_malloc_flags(size, &dirty);
    if (!p) return prev->allocator.calloc(prev->allocator.ctx, nelem, elsize);
    if (dirty) memset(p, 0, size);
    return p;
}

static void h_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    if (!ours(ptr)) {
        prev->allocator.free(prev->allocator.ctx, ptr, size);
        return;
    }
    if (in_child) return; /* the parent's range: never handed out here again */
    pthread_mutex_lock(&lock);
    size_t i = find_used(ptr);
    if (i < nused) {
        Range r = used[i];
        remove_at(used, &nused, i);
        in_use -= r.len;
        r.dirty = 1;
        if (r.forked && children_map()) {
            /* (neither handed out nor punched: a child may read it; a failed insert leaks
             * the range, which is safe) */
            r.forked = 0;
            if (grow(&quar, &capquar, nquar + 1) == 0) quar[nquar++] = r;
            n_quarantined++;
        } else {
            punch_or_keep(r);
        }
    }
    pthread_mutex_unlock(&lock);
}

/* a freed range back on the free list, its pages given back to the system beyond what may
 * be kept (lock held) */
static int punch(Range *r) {
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)r->off,
                  (off_t)r->len) != 0)
        return -1;
    r->backed = 0;
    r->dirty = 0;
    n_punched++;
    return 0;
}

/* The range just freed is the likeliest to be asked for again (a loop's array of one
 * size): it keeps its pages where it fits under keep_max, and older kept ranges give theirs
 * back first, largest first; one larger than keep_max gives back its own. */
static void punch_or_keep(Range r) {
    r.forked = 0;
    if (r.len > keep_max) {
        punch(&r);
    } else {
        size_t kept = kept_bytes();
        while (kept + r.len > keep_max) {
            size_t big = nfree;
            for (size_t i = 0; i < nfree; i++)
                if (freel[i].dirty && (big == nfree || freel[i].len > freel[big].len)) big = i;
            if (big == nfree || punch(&freel[big]) != 0) break;
            kept -= freel[big].len < kept ? freel[big].len : kept;
            coalesce_at(big);
        }
        if (kept + r.len > keep_max) punch(&r);
    }
    give_back(r); /* (a failed insert leaks the range: nothing else to do here) */
}

static void *h_realloc(void *ctx, void *ptr, size_t new_size) {
    if (!ptr) return h_malloc(ctx, new_size);
    if (!ours(ptr)) /* (a block of the previous handler stays with it) */
        return prev->allocator.realloc(prev->allocator.ctx, ptr, new_size);
    size_t old = 0;
    pthread_mutex_lock(&lock);
    size_t i = find_used(ptr);
    if (i < nused) old = used[i].len;
    pthread_mutex_unlock(&lock);
    if (!in_child && round_page(new_size) == old) return ptr;
    void *p = h_malloc(ctx, new_size ? new_size : 1);
    if (!p) return NULL;
    memcpy(p, ptr, new_size < old ? new_size : old);
    h_free(ctx, ptr, old);
    return p;
}

static void at_prepare(void) { pthread_mutex_lock(&lock); }
static void at_parent(void) {
    /* every range in use now may be read by the new child until it exits */
    for (size_t i = 0; i < nused; i++) used[i].forked = 1;
    looked.tv_sec = 0;
    looked.tv_nsec = 0;
    pthread_mutex_unlock(&lock);
}

static void at_child(void) {
    pthread_mutex_unlock(&lock); /* (locked by this thread in at_prepare) */
    if (!owner || in_child) return; /* a child of a child: already private */
    in_child = 1;
    child_errno = 0;
    child_shared = 1;
    if (top == 0) return;
    void *p = mmap(base, top, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
                   fd, 0);
    if (p == (void *)base) {
        child_shared = 0;
        return;
    }
    child_errno = errno;
    /* a kernel before 6.12 unmaps the old mapping before it fails: map it shared again */
    p = mmap(base, top, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0);
    child_shared = p == (void *)base ? 1 : -1;
}

static int load_api(void) {
    if (api) return 0;
    PyObject *mod = PyImport_ImportModule("numpy._core._multiarray_umath");
    if (!mod) return -1;
    PyObject *c = PyObject_GetAttrString(mod, "_ARRAY_API");
    Py_DECREF(mod);
    if (!c) return -1;
    api = (void **)PyCapsule_GetPointer(c, NULL);
    Py_DECREF(c);
    return api ? 0 : -1;
}

static PyObject *get_handler(void) { return ((PyObject * (*)(void)) api[API_GET_HANDLER])(); }

static PyObject *set_handler(PyObject *h) {
    return ((PyObject * (*)(PyObject *)) api[API_SET_HANDLER])(h);
}

/* enable(reserve, min_bytes, keep_max, prefault) -> (fd, base address) */
static PyObject *py_enable(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long res, minb, keep;
    int pf;
    if (!PyArg_ParseTuple(args, "KKKp", &res, &minb, &keep, &pf)) return NULL;
    if (load_api()) return NULL;
    if (owner && !in_child) { /* once per process: the same arena, settings updated */
        pthread_mutex_lock(&lock);
        min_bytes = minb;
        keep_max = keep;
        pthread_mutex_unlock(&lock);
    } else {
        if (in_child) {
            PyErr_SetString(PyExc_RuntimeError,
                            "a fork() child cannot make an arena of its own");
            return NULL;
        }
        reserve = round_page(res);
        int f = (int)syscall(SYS_memfd_create, "hpccomm-arena", MFD_CLOEXEC);
        if (f < 0) return PyErr_SetFromErrno(PyExc_OSError);
        if (ftruncate(f, (off_t)reserve) != 0) {
            int e = errno;
            close(f);
            errno = e;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        void *p = mmap(NULL, reserve, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, f, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(f);
            errno = e;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
#ifdef MADV_HUGEPAGE
        madvise(p, reserve, MADV_HUGEPAGE); /* where shmem huge pages are "advise" */
#endif
        static int registered;
        if (!registered) {
            if (pthread_atfork(at_prepare, at_parent, at_child) != 0) {
                munmap(p, reserve);
                close(f);
                PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
                return NULL;
            }
            registered = 1;
        }
        struct stat st;
        if (fstat(f, &st) != 0) {
            int e = errno;
            munmap(p, reserve);
            close(f);
            errno = e;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        pthread_mutex_lock(&lock);
        file_ino = st.st_ino;
        fd = f;
        base = p;
        min_bytes = minb;
        keep_max = keep;
        prefault = pf;
        top = 0;
        owner = getpid();
        pthread_mutex_unlock(&lock);
    }
    PyObject *cur = get_handler();
    if (!cur) return NULL;
    if (cur != capsule) {
        if (!capsule) {
            Handler *h = (Handler *)PyCapsule_GetPointer(cur, "mem_handler");
            if (!h || h->version != 1) {
                Py_DECREF(cur);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError,
                                    "NumPy's data allocator is not a version-1 handler");
                return NULL;
            }
            prev = h;
            prev_capsule = cur; /* (the reference is kept) */
            cur = NULL;
            memset(&mine, 0, sizeof mine);
            strncpy(mine.name, "hpccomm_arena", sizeof mine.name - 1);
            mine.version = 1;
            mine.allocator = (Allocator){NULL, h_malloc, h_calloc, h_realloc, h_free};
            capsule = PyCapsule_New(&mine, "mem_handler", NULL);
            if (!capsule) return NULL;
        }
        PyObject *old = set_handler(capsule);
        if (!old) {
            Py_XDECREF(cur);
            return NULL;
        }
        Py_DECREF(old);
    }
    Py_XDECREF(cur);
    return Py_BuildValue("(iK)", fd, (unsigned long long)(uintptr_t)base);
}

/* disable(): NumPy's allocations in this context go to the previous handler again (arrays
 * in the arena stay there and are freed here) */
static PyObject *py_disable(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    if (!capsule || load_api()) Py_RETURN_NONE;
    PyObject *cur = get_handler();
    if (!cur) return NULL;
    if (cur == capsule) {
        PyObject *old = set_handler(prev_capsule);
        if (!old) {
            Py_DECREF(cur);
            return NULL;
        }
        Py_DECREF(old);
    }
    Py_DECREF(cur);
    Py_RETURN_NONE;
}

static PyObject *py_state(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    pthread_mutex_lock(&lock);
    size_t kept = kept_bytes(), held = 0;
    for (size_t i = 0; i < nquar; i++) held += quar[i].len;
    PyObject *d = Py_BuildValue(
        "{s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:i,s:i,s:i,s:i,s:K,s:K}",
        "fd", fd, "base", (unsigned long long)(uintptr_t)base, "reserve",
        (unsigned long long)reserve, "min_bytes", (unsigned long long)min_bytes, "keep_max",
        (unsigned long long)keep_max, "top", (unsigned long long)top, "in_use",
        (unsigned long long)in_use, "peak", (unsigned long long)peak, "kept",
        (unsigned long long)kept, "allocations", n_alloc, "fallbacks", n_fallback, "punched",
        n_punched, "free_ranges", (unsigned long long)nfree, "owner", (int)owner, "in_child",
        in_child, "child_errno", child_errno, "child_shared", child_shared, "prefault",
        prefault, "quarantined", (unsigned long long)held, "quarantines", n_quarantined);
    pthread_mutex_unlock(&lock);
    return d;
}

/* owns(address, nbytes) -> whether [address, address + nbytes) lies in a live range */
static PyObject *py_owns(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long a, n;
    if (!PyArg_ParseTuple(args, "KK", &a, &n)) return NULL;
    char *p = (char *)(uintptr_t)a;
    int yes = 0;
    if (ours(p) && !in_child && n <= reserve) {
        size_t off = (size_t)(p - base);
        pthread_mutex_lock(&lock);
        size_t i = lower(used, nused, off + 1);
        if (i > 0 && used[i - 1].off <= off && off + n <= used[i - 1].off + used[i - 1].len)
            yes = 1;
        pthread_mutex_unlock(&lock);
    }
    return PyBool_FromLong(yes);
}

static PyObject *py_current(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    if (load_api()) return NULL;
    PyObject *cur = get_handler();
    if (!cur) return NULL;
    int yes = capsule && cur == capsule;
    Py_DECREF(cur);
    return PyBool_FromLong(yes);
}

static PyMethodDef methods[] = {
    {"enable", py_enable, METH_VARARGS,
     "enable(reserve, min_bytes, keep_max, prefault) -> (fd, base): make the arena (once) "
     "and set its handler in the calling context"},
    {"disable", py_disable, METH_NOARGS, "set the previous handler in the calling context"},
    {"state", py_state, METH_NOARGS, "the arena's figures (a dict)"},
    {"owns", py_owns, METH_VARARGS,
     "owns(address, nbytes): whether the bytes lie inside one live range of the arena"},
    {"current", py_current, METH_NOARGS, "whether the arena's handler is set in this context"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_arena", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__arena(void) { return PyModule_Create(&module); }
