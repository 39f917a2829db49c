#!/usr/bin/env python3
# How the coefficients of include/remat/numeric/float_math.hpp were made: near-minimax polynomials
# (weighted least squares with Lawson's reweighting towards the minimax error) in 40-digit
# arithmetic with mpmath, printed as hex doubles; the header rounds them to float. The
# exhaustive test (tests/expr/test_float_math.cpp) is what checks the result, not this script.
#
#   python3 scripts/fit_float_math.py exp 6                # e^r, |r| <= 0.3467: c2..c6
#   python3 scripts/fit_float_math.py erf_small 5 0.921875  # erf(x) = x + x Q(x^2), |x| < 0.921875
#   python3 scripts/fit_float_math.py erf_large 7 0.921875 4.0 1.0   # log erfc(a) in a - 1
#   python3 scripts/fit_float_math.py tanh_small 4 0.625   # tanh(x) = x + x^3 P(x^2), |x| < 0.625
#   python3 scripts/fit_float_math.py normal_tail 4 14.5    # Phi(-a) e^(a^2/2) = N(a) / D(a), a <= 14.5
#
# Needs mpmath (Debian: python3-mpmath). Not part of the build or the tests.
import sys

import mpmath as mp

mp.mp.dps = 40


def fit(f, basis, count, lo, hi, scale, n=400, iters=30):
    """Coefficients c minimising max |f(x) - sum c_j basis_j(x)| / scale(x) on [lo, hi]."""
    xs = [lo + (hi - lo) * (1 - mp.cos(mp.pi * (k + 0.5) / n)) / 2 for k in range(n)]
    w = [mp.mpf(1)] * n
    for _ in range(iters):
        rows, rhs = [], []
        for i, x in enumerate(xs):
            sw = mp.sqrt(w[i]) / scale(x)
            rows.append([basis(j, x) * sw for j in range(count)])
            rhs.append(f(x) * sw)
        c = mp.qr_solve(mp.matrix(rows), mp.matrix(rhs))[0]
        err = [(f(x) - sum(c[j] * basis(j, x) for j in range(count))) / scale(x) for x in xs]
        worst = max(abs(e) for e in err)
        total = sum(w[i] * abs(err[i]) for i in range(n))
        w = [max(w[i] * abs(err[i]) / total, mp.mpf(10) ** -30) for i in range(n)]
    return c, worst


def fit_rational(f, m, lo, hi, n=300, iters=30):
    """N (degree m) and D (degree m + 1, D(0) = 1) minimising max |N / D - f| / f on [lo, hi]:
    linearised (N - f D weighted by 1 / (f D) of the last iterate), with Lawson's reweighting."""
    xs = [lo + (hi - lo) * (1 - mp.cos(mp.pi * (k + 0.5) / n)) / 2 for k in range(n)]
    fs = [f(x) for x in xs]
    w, d_prev = [mp.mpf(1)] * n, [mp.mpf(1)] * n
    ev = lambda p, x: sum(p[j] * x**j for j in range(len(p)))
    for _ in range(iters):
        rows, rhs = [], []
        for i, x in enumerate(xs):
            s = mp.sqrt(w[i]) / (fs[i] * d_prev[i])
            rows.append([x**j * s for j in range(m + 1)] + [-fs[i] * x**j * s for j in range(1, m + 2)])
            rhs.append(fs[i] * s)
        c = mp.qr_solve(mp.matrix(rows), mp.matrix(rhs))[0]
        num = [c[j] for j in range(m + 1)]
        den = [mp.mpf(1)] + [c[m + 1 + j] for j in range(m + 1)]
        d_prev = [ev(den, x) for x in xs]
        err = [(ev(num, x) / d_prev[i] - fs[i]) / fs[i] for i, x in enumerate(xs)]
        worst = max(abs(e) for e in err)
        total = sum(w[i] * abs(err[i]) for i in range(n))
        w = [max(w[i] * abs(err[i]) / total, mp.mpf(10) ** -30) for i in range(n)]
    return num + den, worst


def main():
    which, deg = sys.argv[1], int(sys.argv[2])
    power = lambda j, x: x ** j
    if which == "exp":  # relative error of 1 + r + r^2 P(r)
        h = mp.mpf("0.3467")  # ln 2 / 2 and the rounding of round(x log2 e) in float
        f = lambda r: (mp.exp(r) - 1 - r) / (r * r) if r != 0 else mp.mpf(0.5)
        scale = lambda r: mp.exp(r) / (r * r) if r != 0 else mp.mpf(10) ** 10
        c, worst = fit(f, power, deg - 1, -h, h, scale)
    elif which == "erf_small":  # relative error of x + x Q(x^2)
        cut = mp.mpf(sys.argv[3])
        f = lambda s: mp.erf(mp.sqrt(s)) / mp.sqrt(s) - 1 if s != 0 else 2 / mp.sqrt(mp.pi) - 1
        scale = lambda s: mp.erf(mp.sqrt(s)) / mp.sqrt(s) if s != 0 else 2 / mp.sqrt(mp.pi)
        c, worst = fit(f, power, deg + 1, mp.mpf(0), cut * cut, scale)
    elif which == "erf_large":  # absolute error of erf = 1 - exp(L(a)): L's error weighted by erfc
        lo, hi, shift = mp.mpf(sys.argv[3]), mp.mpf(sys.argv[4]), mp.mpf(sys.argv[5])
        f = lambda a: mp.log(mp.erfc(a))
        c, worst = fit(f, lambda j, a: (a - shift) ** j, deg + 1, lo, hi, lambda a: 1 / mp.erfc(a))
    elif which == "tanh_small":  # relative error of x + x^3 P(x^2)
        cut = mp.mpf(sys.argv[3])
        f = lambda s: (mp.tanh(mp.sqrt(s)) - mp.sqrt(s)) / (mp.sqrt(s) * s) if s != 0 else mp.mpf(-1) / 3
        scale = lambda s: mp.tanh(mp.sqrt(s)) / (mp.sqrt(s) * s) if s != 0 else mp.mpf(10) ** 10
        c, worst = fit(f, power, deg + 1, mp.mpf(0), cut * cut, scale)
    elif which == "normal_tail":  # relative error of Phi(-a) e^(a^2/2) = N(a) / D(a): N's, then D's
        hi = mp.mpf(sys.argv[3])
        c, worst = fit_rational(lambda a: mp.ncdf(-a) * mp.exp(a * a / 2), deg, mp.mpf(0), hi)
    else:
        sys.exit("which: exp, erf_small, erf_large, tanh_small or normal_tail")
    print("max weighted error", mp.nstr(worst, 5))
    for v in c:
        print(f"  {float(v).hex()}  // {float(v)!r}")


if __name__ == "__main__":
    main()
