#!/usr/bin/python3
"""NumPy reference quantiser for the KV storage formats (POLICIES.md 17; kernels/common/kv_format.h):
checks, bit for bit, the codes, scales and dequantised rows kvlab's paged store holds.

The C++ helper (framework/kv/kv_format_dump.cpp) appends rows to a one-head KvStore of each format
and prints what the store keeps. This script derives the same independently, with NumPy's own
conversions where it has them and a different method where it does not:
  bf16      round to nearest even on the float32 bits (uint32 arithmetic).
  f16       NumPy's float32 -> float16 cast (IEEE round to nearest even, overflow to inf).
  int8      s = float32(max|x|) / 127, q = clip(rint(x / s), -127, 127) in float32, x^ = q * s.
  fp8       by search, not by bit manipulation: the table of every non-negative code's value
            (e4m3fn: codes 0..0x7E, e5m2: 0..0x7B), the nearest to |x / S|, ties to the even
            code (an even mantissa), saturating at the largest; the sign bit from signbit(x).
  int4/int2 KIVI: groups of G consecutive rows; keys per channel, values per group of G channels:
            s = float32(max - min) / L, z = min, q = clip(rint(float32(x - z) / s), 0, L) (0 where
            s = 0), x^ = s * q + z rounded once (exact rational arithmetic, then round to nearest
            float32, ties to even: an independent fma); codes packed channel d at bit b * (d mod
            8/b) of byte d * b / 8. Rows of the last R + (partial group) stay float32 as given.
Rows: random normal at several magnitudes, and adversarial ones: all-zero, constant, signed zeros,
one huge outlier, subnormals (alone and mixed with normals), values past each format's range,
exact rounding ties. Refused: a NaN in any format, an infinity in int8 / fp8 (exit 1, the message
names NaN); bf16 / f16 store an infinity.

    /usr/bin/python3 tests/reference/kv_format_ref_test.py PATH/TO/kv_format_dump
"""

import subprocess
import sys
from fractions import Fraction

import numpy as np

F32 = np.float32


def minifloat_table(e_bits, m_bits, max_code):
    bias = 2 ** (e_bits - 1) - 1
    vals = []
    for c in range(max_code + 1):
        e, m = c >> m_bits, c & ((1 << m_bits) - 1)
        vals.append(m * 2.0 ** (1 - bias - m_bits) if e == 0 else (2 ** m_bits + m) * 2.0 ** (e - bias - m_bits))
    return np.array(vals, dtype=np.float64)


E4M3 = minifloat_table(4, 3, 0x7E)
E5M2 = minifloat_table(5, 2, 0x7B)


def fp8_encode(y, table, sign_bit):
    """y: float32 array (already divided by the scale). Nearest code, ties to even, saturating."""
    a = np.abs(y.astype(np.float64))
    codes = np.empty(y.shape, dtype=np.uint8)
    for i, v in enumerate(a.ravel()):
        d = np.abs(table - v)
        best = np.flatnonzero(d == d.min())
        c = best[0] if len(best) == 1 else [b for b in best if b % 2 == 0][0]
        codes.ravel()[i] = c
    return codes | np.where(np.signbit(y), sign_bit, 0).astype(np.uint8)


def reference(fmt, x, fp8_scale):
    """-> (codes as bytes, scale float32, dequantised float32 row)."""
    x = x.astype(F32)
    if fmt == "f32":
        return x.tobytes(), F32(1), x
    if fmt == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        return b.tobytes(), F32(1), (b.astype(np.uint32) << 16).view(F32)
    if fmt == "f16":
        h = x.astype(np.float16)
        return h.view(np.uint16).tobytes(), F32(1), h.astype(F32)
    if fmt == "int8":
        s = F32(np.max(np.abs(x))) / F32(127)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            q = np.clip(np.rint(x / s), -127, 127) if s > 0 else np.zeros_like(x)
        q = q.astype(np.int8)
        return q.tobytes(), F32(s), (q.astype(F32) * F32(s)).astype(F32)
    table, name = (E4M3, "e4m3") if fmt == "fp8_e4m3" else (E5M2, "e5m2")
    S = F32(fp8_scale)
    codes = fp8_encode((x / S).astype(F32), table, 0x80)
    vals = table[codes & 0x7F].astype(F32)
    vals = np.where(codes & 0x80, -vals, vals).astype(F32)
    return codes.tobytes(), S, (vals * S).astype(F32)


def round_f32(fr):
    """The float32 nearest to the Fraction fr, ties to even."""
    c = np.float32(float(fr))
    best, best_d = None, None
    for cand in (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))):
        d = abs(Fraction(float(cand)) - fr)
        if best is None or d < best_d or (d == best_d and (cand.view(np.uint32) & 1) == 0):
            best, best_d = cand, d
    return np.float32(best)


def kivi_quant(x, bits):
    """x: float32 values of one group -> (s, z, codes, dequantised)."""
    L = F32(2 ** bits - 1)
    mx, mn = F32(np.max(x)), F32(np.min(x))
    mx, mn = (F32(0) if mx == 0 else mx), (F32(0) if mn == 0 else mn)  # a zero max / min is +0 (kv_format.h)
    s, z = F32(mx - mn) / L, mn
    if s > 0:
        q = np.clip(np.rint((x - z).astype(F32) / s), 0, 2 ** bits - 1).astype(np.int64)
    else:
        q = np.zeros(x.shape, dtype=np.int64)
    deq = np.array([round_f32(Fraction(float(s)) * int(qi) + Fraction(float(z))) for qi in q], dtype=F32)
    return F32(s), F32(z), q, deq


def kivi_pack(q, bits):
    per = 8 // bits
    out = np.zeros(len(q) // per, dtype=np.uint8)
    for d, v in enumerate(q):
        out[d // per] |= np.uint8(int(v) << (bits * (d % per)))
    return out.tobytes()


def kivi_check(exe, fmt, rows, G, R):
    """Returns the number of failures (printed)."""
    bits = 4 if fmt == "int4" else 2
    n, d = rows.shape
    r = subprocess.run([exe, fmt, str(d), "1.0", str(G), str(R)], input=rows.astype(F32).tobytes(), capture_output=True)
    if r.returncode != 0:
        print(f"FAIL {fmt} G={G} R={R}: dump exited {r.returncode}: {r.stderr.decode()}")
        return 1
    out = r.stdout
    q_slots = int(np.frombuffer(out[:4], np.int32)[0])
    want_q = max(0, (n - R) // G * G)
    fails = 0
    if q_slots != want_q:
        print(f"FAIL {fmt} G={G} R={R}: {q_slots} quantised slots, expected {want_q}")
        return 1
    rb = d * bits // 8
    sizes = [(rb, 2 * d, d), (rb, 2 * (d // G), d)]
    per = [a + 4 * b + 4 * c for a, b, c in sizes]
    if len(out) != 4 + n * sum(per):
        print(f"FAIL {fmt}: {len(out)} bytes, expected {4 + n * sum(per)}")
        return 1
    o = 4
    for i in range(n):
        for which in (0, 1):
            a, b, c = sizes[which]
            codes = out[o:o + a]
            meta = np.frombuffer(out[o + a:o + a + 4 * b], F32)
            deq = np.frombuffer(out[o + a + 4 * b:o + per[which]], F32)
            o += per[which]
            x = rows[i] if which == 0 else -rows[i]
            if i >= q_slots:
                ok = deq.tobytes() == x.astype(F32).tobytes()
                what = "residual row"
            elif which == 0:  # keys: per channel over the group of G rows
                g0 = i // G * G
                grp = rows[g0:g0 + G]
                want_deq = np.zeros(d, F32); s_all = np.zeros(d, F32); z_all = np.zeros(d, F32); q_all = []
                for ch in range(d):
                    s_, z_, q_, dq_ = kivi_quant(grp[:, ch].astype(F32), bits)
                    s_all[ch], z_all[ch] = s_, z_
                    q_all.append(q_[i - g0]); want_deq[ch] = dq_[i - g0]
                ok = (codes == kivi_pack(q_all, bits) and meta[:d].tobytes() == s_all.tobytes()
                      and meta[d:].tobytes() == z_all.tobytes() and deq.tobytes() == want_deq.tobytes())
                what = "key"
            else:  # values: per token over groups of G channels
                want_deq = np.zeros(d, F32); q_all = []; sz = []
                for g in range(d // G):
                    s_, z_, q_, dq_ = kivi_quant(x[g * G:(g + 1) * G].astype(F32), bits)
                    sz += [s_, z_]; q_all += list(q_); want_deq[g * G:(g + 1) * G] = dq_
                ok = (codes == kivi_pack(q_all, bits) and meta.tobytes() == np.array(sz, F32).tobytes()
                      and deq.tobytes() == want_deq.tobytes())
                what = "value"
            if not ok:
                fails += 1
                if fails < 5:
                    print(f"FAIL {fmt} G={G} R={R} row {i} {what}: deq {deq[:4]} x {x[:4]}")
    return fails


def test_rows(d, rng):
    rows = []
    for mag in (1e-3, 1.0, 30.0, 1e3):
        rows += list(rng.standard_normal((8, d)) * mag)
    rows.append(np.zeros(d))
    rows.append(np.full(d, 0.7))
    rows.append(np.full(d, -3.25))
    z = np.zeros(d); z[::2] = -0.0; rows.append(z)
    o = rng.standard_normal(d); o[d // 2] = 1e4; rows.append(o)
    o = rng.standard_normal(d) * 1e-3; o[0] = -500.0; rows.append(o)
    rows.append(rng.standard_normal(d) * 1e-40)                    # subnormal float32
    m = rng.standard_normal(d); m[::3] = 3e-39; m[1::3] = -1e-45; rows.append(m)
    rows.append(np.full(d, 1e-45))
    rows.append(rng.standard_normal(d) * 1e5)                      # past e4m3 and f16 range
    rows.append(np.linspace(-70000.0, 70000.0, d))                 # past f16's, within e5m2's
    rows.append(rng.standard_normal(d) * 1e-8)                     # below fp8's range: subnormal codes / 0
    t = np.arange(d) + 0.5; t[0] = 127.0; rows.append(t)           # int8 ties (s = 1 when max is 127)
    rows.append((np.arange(d) % 17 - 8) * 0.0625 + 1.03125)        # bf16 / fp8 ties on the grid
    return np.array(rows, dtype=F32)


def run(exe, fmt, d, scale, rows):
    return subprocess.run([exe, fmt, str(d), repr(scale)], input=rows.astype(F32).tobytes(),
                          capture_output=True)


def main():
    exe = sys.argv[1]
    rng = np.random.default_rng(15)
    failures = 0
    checked = 0
    elem = {"f32": 4, "bf16": 2, "f16": 2, "int8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
    for fmt in elem:
        for d in (64, 7):
            for scale in ((1.0, 0.05, 8.0) if fmt.startswith("fp8") else (1.0,)):
                rows = test_rows(d, rng)
                r = run(exe, fmt, d, scale, rows)
                if r.returncode != 0:
                    print(f"FAIL {fmt} d={d}: dump exited {r.returncode}: {r.stderr.decode()}")
                    failures += 1
                    continue
                out = r.stdout
                rb = d * elem[fmt]
                per = rb + 4 + 4 * d
                if len(out) != 2 * per * len(rows):
                    print(f"FAIL {fmt} d={d}: {len(out)} bytes, expected {2 * per * len(rows)}")
                    failures += 1
                    continue
                for i, x in enumerate(rows):
                    for which, row in enumerate((x, -x)):
                        o = (2 * i + which) * per
                        codes, s, deq = out[o:o + rb], np.frombuffer(out[o + rb:o + rb + 4], F32)[0], \
                            np.frombuffer(out[o + rb + 4:o + per], F32)
                        rc, rs, rdeq = reference(fmt, row.astype(F32), scale)
                        ok = codes == rc and s.tobytes() == F32(rs).tobytes() and deq.tobytes() == rdeq.astype(F32).tobytes()
                        checked += 1
                        if not ok:
                            failures += 1
                            if failures < 10:
                                bad = np.flatnonzero(np.frombuffer(codes, np.uint8) != np.frombuffer(rc, np.uint8))
                                print(f"FAIL {fmt} d={d} S={scale} row {i} {'KV'[which]}: scale {s!r} vs {rs!r}; "
                                      f"code bytes differ at {bad[:8]}; x={row[:4]} deq={deq[:4]} ref={rdeq[:4]}")
        # Refused rows: NaN in every format (but f32, which stores what it is given), inf in the scaled ones.
        d = 8
        bad_rows = [("NaN", np.array([1, 2, np.nan, 4, 5, 6, 7, 8], dtype=F32))]
        if fmt in ("int8", "fp8_e4m3", "fp8_e5m2"):
            bad_rows.append(("infinite", np.array([1, 2, 3, np.inf, 5, 6, 7, 8], dtype=F32)))
        for what, row in bad_rows:
            if fmt == "f32":
                continue
            r = run(exe, fmt, d, 1.0, np.stack([np.ones(d, F32), row]))
            msg = r.stderr.decode()
            checked += 1
            if r.returncode != 1 or what not in msg or msg.count("\n") != 1:
                print(f"FAIL {fmt}: a {what} row gave exit {r.returncode}, stderr {msg!r}")
                failures += 1
        if fmt in ("bf16", "f16"):
            row = np.array([np.inf, -np.inf, 1, 2, 3, 4, 5, 6], dtype=F32)
            r = run(exe, fmt, 8, 1.0, row[None, :])
            deq = np.frombuffer(r.stdout[16 + 4:16 + 4 + 32], F32) if r.returncode == 0 else None
            checked += 1
            if deq is None or not (np.isposinf(deq[0]) and np.isneginf(deq[1])):
                print(f"FAIL {fmt}: infinity not stored as infinity ({r.returncode}, {r.stderr!r})")
                failures += 1
    # KIVI: every row of test_rows as a stream of tokens, groups of G, R residual.
    for fmt in ("int4", "int2"):
        for d, G, R in ((64, 32, 0), (64, 8, 16), (16, 4, 0)):
            rows = test_rows(d, rng)
            rows = rows[np.all(np.abs(rows) < 1e30, axis=1)]
            f = kivi_check(exe, fmt, rows, G, R)
            checked += len(rows)
            failures += f
        for what, bad in (("NaN", np.nan), ("infinite", np.inf)):
            row = np.ones((2, 8), dtype=F32); row[1, 3] = bad
            r = subprocess.run([exe, fmt, "8", "1.0", "4", "0"], input=row.tobytes(), capture_output=True)
            checked += 1
            if r.returncode != 1 or what not in r.stderr.decode():
                print(f"FAIL {fmt}: a {what} row gave exit {r.returncode}, {r.stderr!r}")
                failures += 1
    r = subprocess.run([exe, "int3", "8", "1"], input=b"", capture_output=True)
    checked += 1
    if r.returncode != 1 or b"valid: f32, bf16, f16, int8, fp8_e4m3, fp8_e5m2, int4, int2" not in r.stderr:
        print(f"FAIL unknown format: exit {r.returncode}, {r.stderr!r}")
        failures += 1
    print(f"kv_format_ref_test: {checked} rows / cases checked, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
