/* CRC-32C (Castagnoli), the checksum of the disk cache's tile files.
 *
 * The same value as the crc32c package (and iSCSI, ext4, zarr's crc32c codec):
 * reflected polynomial 0x82F63B78, initial and final XOR 0xFFFFFFFF, so a
 * running value chains as insitu_crc32c(insitu_crc32c(0, a), b). The CPU's
 * instruction is used where there is one (SSE 4.2 on x86-64, checked at run
 * time; ARMv8 CRC when the compiler targets it); elsewhere slicing-by-8 over
 * tables. insitu_crc32c_init builds the tables and constants once, before
 * any call. Callable without the GIL.
 */
#ifndef INSITU_CRC32C_H
#define INSITU_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define INSITU_CRC32C_POLY 0x82F63B78u
/* the hardware path runs three streams of this many bytes side by side */
#define INSITU_CRC32C_LANE 512

static uint32_t insitu_crc32c_table[8][256];

/* a * b modulo the polynomial, both in the reflected bit order the CRC uses */
static uint32_t insitu_crc32c_mulmod(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) product ^= b;
        b = (b & 1) ? (b >> 1) ^ INSITU_CRC32C_POLY : b >> 1;
    }
    return product;
}

/* x^(8 n) modulo the polynomial: what a raw CRC state is multiplied by when n zero bytes follow */
static uint32_t insitu_crc32c_xpow8n(size_t n) {
    uint32_t result = 1u << 31, square = 1u << 23; /* x^0 and x^8 */
    while (n) {
        if (n & 1) result = insitu_crc32c_mulmod(result, square);
        square = insitu_crc32c_mulmod(square, square);
        n >>= 1;
    }
    return result;
}

/* multiplying by a fixed power of x, a byte of the state at a time: tables for x^(8 LANE) and x^(16 LANE) */
static uint32_t insitu_crc32c_lane1[4][256], insitu_crc32c_lane2[4][256];

static void insitu_crc32c_power_table(uint32_t table[4][256], uint32_t xpow) {
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) table[k][b] = insitu_crc32c_mulmod(b << (8 * k), xpow);
}

/* a raw state moved over the bytes that follow it (their own CRC is XORed in by the caller) */
static inline uint32_t insitu_crc32c_shift(uint32_t state, const uint32_t table[4][256]) {
    return table[0][state & 0xff] ^ table[1][(state >> 8) & 0xff] ^ table[2][(state >> 16) & 0xff] ^
           table[3][state >> 24];
}

static void insitu_crc32c_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ INSITU_CRC32C_POLY : c >> 1;
        insitu_crc32c_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = insitu_crc32c_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = insitu_crc32c_table[0][c & 0xff] ^ (c >> 8);
            insitu_crc32c_table[k][n] = c;
        }
    }
    insitu_crc32c_power_table(insitu_crc32c_lane1, insitu_crc32c_xpow8n(INSITU_CRC32C_LANE));
    insitu_crc32c_power_table(insitu_crc32c_lane2, insitu_crc32c_xpow8n(2 * INSITU_CRC32C_LANE));
}

static uint32_t insitu_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n) {
    const uint32_t(*t)[256] = (const uint32_t(*)[256])insitu_crc32c_table;
    crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
              t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define INSITU_CRC32C_HW 1
/* the instruction's latency is three cycles, its throughput one: three streams of LANE bytes run side by
 * side, then the first two are shifted over the bytes that followed them and folded in */

__attribute__((target("sse4.2"))) static uint64_t insitu_crc32c_run(uint64_t c, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return c;
}

__attribute__((target("sse4.2"))) static uint32_t insitu_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = ~crc & 0xffffffffu;
    while (n >= 3 * INSITU_CRC32C_LANE) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < INSITU_CRC32C_LANE; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + INSITU_CRC32C_LANE + i, 8);
            memcpy(&w2, p + 2 * INSITU_CRC32C_LANE + i, 8);
            c = __builtin_ia32_crc32di(c, w0);
            c1 = __builtin_ia32_crc32di(c1, w1);
            c2 = __builtin_ia32_crc32di(c2, w2);
        }
        c = insitu_crc32c_shift((uint32_t)c, insitu_crc32c_lane2) ^ insitu_crc32c_shift((uint32_t)c1, insitu_crc32c_lane1) ^ c2;
        p += 3 * INSITU_CRC32C_LANE;
        n -= 3 * INSITU_CRC32C_LANE;
    }
    return ~(uint32_t)insitu_crc32c_run(c, p, n);
}
static int insitu_crc32c_has_hw(void) { return __builtin_cpu_supports("sse4.2"); }
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#define INSITU_CRC32C_HW 1
#include <arm_acle.h>
static uint32_t insitu_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        crc = __crc32cd(crc, w);
        p += 8;
        n -= 8;
    }
    while (n--) crc = __crc32cb(crc, *p++);
    return ~crc;
}
static int insitu_crc32c_has_hw(void) { return 1; }
#endif

/* the running CRC-32C `crc` (0 to start) extended over `n` bytes at `p` */
static uint32_t insitu_crc32c(uint32_t crc, const void *p, size_t n) {
#ifdef INSITU_CRC32C_HW
    static int hw = -1; /* a benign race: every thread computes the same answer */
    if (hw < 0) hw = insitu_crc32c_has_hw();
    if (hw) return insitu_crc32c_hw(crc, (const unsigned char *)p, n);
#endif
    return insitu_crc32c_sw(crc, (const unsigned char *)p, n);
}

#endif /* INSITU_CRC32C_H */
