/* The POSIX calls the kernels make, behind one guard.
 *
 * On POSIX systems each insitu_* function is exactly the call it names
 * (open/read/close, dlopen/dlsym, clock_gettime, mmap/munmap, fstat), so Linux
 * behaves as if the kernels called them directly. Elsewhere (Windows) each
 * has a stand-in with the same contract, so the kernels compile there:
 * files are read with the CRT's _open/_read/_close, the monotonic clock is
 * QueryPerformanceCounter, a loaded codec's entry points are not looked up
 * (the tilegroup kernel then hands every tile to the general decode path),
 * and a file cannot be mapped (ENOSYS: the disk cache refuses such a
 * platform before it maps anything).
 */
#ifndef INSITU_PLATFORM_H
#define INSITU_PLATFORM_H

#include <errno.h>
#include <stddef.h>

#if defined(_WIN32)

#include <fcntl.h>
#include <io.h>
#include <windows.h>

static inline int insitu_open_read(const char *path) { return _open(path, _O_RDONLY | _O_BINARY | _O_NOINHERIT); }

static inline long long insitu_read(int fd, void *buf, size_t count) {
    /* _read takes an unsigned int count: read at most 1 GiB at a time, the caller loops */
    return _read(fd, buf, (unsigned int)(count > (1u << 30) ? (1u << 30) : count));
}

static inline int insitu_close(int fd) { return _close(fd); }

static inline void *insitu_loaded_module(const char *file) {
    (void)file;
    return NULL;
}

static inline void *insitu_symbol(void *module, const char *name) {
    (void)module;
    (void)name;
    return NULL;
}

static inline void insitu_release_module(void *module) { (void)module; }

static inline long long insitu_monotonic_ns(void) {
    LARGE_INTEGER freq, count;
    QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&count);
    return (long long)((double)count.QuadPart * 1e9 / (double)freq.QuadPart);
}

static inline void *insitu_map_file(int fd, size_t length, int writable) {
    (void)fd;
    (void)length;
    (void)writable;
    errno = ENOSYS;
    return NULL;
}

static inline int insitu_unmap_file(void *base, size_t length) {
    (void)base;
    (void)length;
    return -1;
}

static inline void *insitu_map_path(const char *path, size_t *length, long long identity[3]) {
    (void)path;
    (void)length;
    (void)identity;
    errno = ENOSYS;
    return NULL;
}

#else

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static inline int insitu_open_read(const char *path) { return open(path, O_RDONLY | O_CLOEXEC); }

static inline long long insitu_read(int fd, void *buf, size_t count) { return (long long)read(fd, buf, count); }

static inline int insitu_close(int fd) { return close(fd); }

/* an extension module already loaded (RTLD_NOLOAD: never loads one); release it with insitu_release_module */
static inline void *insitu_loaded_module(const char *file) { return dlopen(file, RTLD_NOW | RTLD_NOLOAD); }

static inline void *insitu_symbol(void *module, const char *name) { return dlsym(module, name); }

static inline void insitu_release_module(void *module) { dlclose(module); }

static inline long long insitu_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* the whole file shared, or NULL with errno set */
static inline void *insitu_map_file(int fd, size_t length, int writable) {
    void *p = mmap(NULL, length, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

static inline int insitu_unmap_file(void *base, size_t length) { return munmap(base, length); }

/* open `path` read-only, map all of it shared and close the fd again, in one call: the base, with the
 * size in *length and (inode, size, mtime ns) in identity; NULL with errno set on failure (EINVAL for an
 * empty file, which has nothing to map) */
static inline void *insitu_map_path(const char *path, size_t *length, long long identity[3]) {
    struct stat st;
    void *p = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    if (fstat(fd, &st) == 0) {
        if (st.st_size <= 0) {
            errno = EINVAL;
        } else {
            p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) {
                p = NULL;
            } else {
                *length = (size_t)st.st_size;
                identity[0] = (long long)st.st_ino;
                identity[1] = (long long)st.st_size;
#if defined(__APPLE__)
                identity[2] = (long long)st.st_mtimespec.tv_sec * 1000000000LL + st.st_mtimespec.tv_nsec;
#else
                identity[2] = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
#endif
            }
        }
    }
    int saved = errno;
    close(fd);
    errno = saved;
    return p;
}

#endif
#endif /* INSITU_PLATFORM_H */
