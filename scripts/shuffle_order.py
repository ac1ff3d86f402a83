#!/usr/bin/env python3
"""Reference implementation of rlvr::dataset::shuffled_indices, for cross-checking.

Usage: python3 scripts/shuffle_order.py   (prints the orders pinned in tests/it/dataset.rs)
"""
# Independent re-implementation of rlvr::dataset::shuffled_indices (ChaCha8, 64-bit counter,
# stream 0, key = seed LE bytes + zeros; u64 = two u32 words low first; Fisher-Yates with
# rejection threshold = 2^64 mod bound).
import struct, sys
M = 0xffffffff
def rotl(x, n): return ((x << n) & M) | (x >> (32 - n))
def qr(s, a, b, c, d):
    s[a] = (s[a] + s[b]) & M; s[d] = rotl(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & M; s[b] = rotl(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b]) & M; s[d] = rotl(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & M; s[b] = rotl(s[b] ^ s[c], 7)
def block(key, counter):
    st = [0x61707865, 0x3320646e, 0x79622d32, 0x6b206574] + list(key) + [counter & M, counter >> 32, 0, 0]
    s = st[:]
    for _ in range(4):
        qr(s,0,4,8,12); qr(s,1,5,9,13); qr(s,2,6,10,14); qr(s,3,7,11,15)
        qr(s,0,5,10,15); qr(s,1,6,11,12); qr(s,2,7,8,13); qr(s,3,4,9,14)
    return [(a + b) & M for a, b in zip(s, st)]
class Rng:
    def __init__(self, seed):
        self.key = struct.unpack('<8I', struct.pack('<Q', seed) + bytes(24))
        self.ctr = 0; self.buf = []
    def u32(self):
        if not self.buf:
            self.buf = block(self.key, self.ctr); self.ctr += 1
        return self.buf.pop(0)
    def u64(self):
        lo = self.u32(); hi = self.u32(); return lo | (hi << 32)
def shuffled(n, seed):
    r = Rng(seed); order = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1; th = (2**64) % bound
        while True:
            x = r.u64()
            if x >= th: break
        j = x % bound
        order[i], order[j] = order[j], order[i]
    return order
print(shuffled(10, 0)); print(shuffled(10, 1)); b = shuffled(7473, 0); print(b[:6], b[7472])
