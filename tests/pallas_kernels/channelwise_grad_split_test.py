"""The decomposition K1 (``channelwise_grad_intra_mosaic``) uses, as a float64 NumPy model (CI).

``MOSAIC_GPU.md`` Sec. 19.4.2 / 19.4.6. Per chunk of C = 64 tokens, with ``gamma [C, K]`` the
within-chunk cumsum of the log-decay (non-increasing) and ``M`` a cotangent masked to causal
(``j <= i``), same-document pairs, the gradients through the decayed product
``sum_c X_ic Y_jc e^{gamma_ic - gamma_jc}`` are::

    dX_ic = sum_j M_ij Y_jc e^{gamma_ic - gamma_jc}      (row direction)
    dY_jc = sum_i M_ij X_ic e^{gamma_ic - gamma_jc}      (column direction)

:func:`split_grads` computes both the way the kernel does; every pair ``j <= i`` goes through
exactly one of three routes:

* **band** (``i - j <= 7``, across block edges too): exact, ``M_ij e^{gamma_i - gamma_j}``
  from the coefficients ``c_d[i] = M[i, i - d]``, d = 0..7;
* **past** (different 16-row blocks, ``i - j >= 8``): through ``r_J``, gamma at the last row
  of j's block J, from the band-free copy of ``M`` (the band zeroed);
* **quadrant** (one block, ``i`` in its second half, ``j`` in its first, ``i - j >= 8``):
  through ``m_J``, gamma at row 7 of the block, from the quadrant-only copy.

Every ``exp`` argument is asserted ``<= 0`` (``-inf`` where masked). The three mutations named
in Sec. 19.4.6 (a band of 7, the reference at the block's first row, no document mask) must
fail: the tests check that they do.
"""

import numpy as np
from absl.testing import absltest, parameterized

C, SUB, HALF = 64, 16, 8  # chunk, row block, band width (pairs at most HALF - 1 apart)


def _exp(x):
    """``exp(x)``, asserting no argument is positive (``-inf`` marks a masked entry)."""
    assert np.all(x <= 0), f"positive exponent {np.max(x)}"
    return np.exp(x)


def _masked_exp(x, mask):
    """``exp(x)`` where ``mask``, else exactly 0 (the exponent is masked first)."""
    return _exp(np.where(mask, x, -np.inf))


def masked_cotangent(m, doc, strict, *, doc_mask=True):
    """``M`` masked to ``j <= i`` (``j < i`` if ``strict``) and, with ``doc_mask``, to pairs of
    one document (``doc [C]`` the document index of each row)."""
    i, j = np.indices((C, C))
    keep = i > j if strict else i >= j
    if doc_mask:
        keep &= doc[:, None] == doc[None, :]
    return np.where(keep, m, 0.0)


def dense_grads(m, x, y, gam):
    """``(dX, dY)`` by the dense formulas (``m`` already masked), float64."""
    i, j = np.indices((C, C))
    expo = np.where((i >= j)[:, :, None], gam[:, None, :] - gam[None, :, :], -np.inf)
    e = _exp(expo)  # [C, C, K]
    dx = np.einsum("ij,jc,ijc->ic", m, y, e)
    dy = np.einsum("ij,ic,ijc->jc", m, x, e)
    return dx, dy


def split_grads(m, x, y, gam, *, band=HALF, ref_row=SUB - 1):
    """``(dX, dY)`` through the band / past / quadrant routes (module docstring); ``m`` masked.

    ``band`` and ``ref_row`` (the row of each block whose gamma is the reference of the past
    route) exist for the mutation tests; the kernel uses 8 and 15.
    """
    i, j = np.indices((C, C))
    in_band = i - j < band
    quad = (i // SUB == j // SUB) & (i % SUB >= HALF) & (j % SUB < HALF)
    free = np.where(in_band, 0.0, m)  # the band-free copy (bf16 in the kernel)
    quad_only = np.where(quad & ~in_band, m, 0.0)  # the quadrant-only copy
    rows = np.arange(C)[:, None]
    blocks = rows // SUB
    second = rows % SUB >= HALF
    dx, dy = np.zeros_like(x), np.zeros_like(y)
    for blk in range(C // SUB - 1):  # past: column block J, rows of the later blocks
        cols = slice(SUB * blk, SUB * (blk + 1))
        r = gam[SUB * blk + ref_row]
        later, inside = blocks > blk, blocks == blk
        dx += _masked_exp(gam - r, later) * (free[:, cols] @ (y[cols] * _exp(r - gam[cols])))
        dy += _masked_exp(r - gam, inside) * (free.T @ (x * _masked_exp(gam - r, later)))
    mid = gam[SUB * (rows[:, 0] // SUB) + HALF - 1]  # gamma at row 7 of each row's block
    dx += _masked_exp(gam - mid, second) * (quad_only @ (y * _masked_exp(mid - gam, ~second)))
    dy += _masked_exp(mid - gam, ~second) * (quad_only.T @ (x * _masked_exp(gam - mid, second)))
    for d in range(band):  # the band, exact: c_d[i] = M[i, i - d]
        t = np.arange(d, C)  # rows i with i - d in the chunk
        coef = m[t, t - d][:, None]
        e = _exp(gam[t] - gam[t - d])
        dx[t] += coef * y[t - d] * e
        dy[t - d] += coef * x[t] * e
    return dx, dy


def _inputs(seed, k=6, strong=True):
    """Random ``(m, x, y, gam)``: log-decays to -20 per token in some channels (``strong``)."""
    rng = np.random.default_rng(seed)
    low = np.where(np.arange(k) % 2 == 0, -20.0, -0.5) if strong else -0.5
    g = rng.uniform(0.0, 1.0, (C, k)) * low
    g[rng.uniform(size=(C, k)) < 0.2] = 0.0  # tokens without decay
    return (rng.normal(size=(C, C)), rng.normal(size=(C, k)), rng.normal(size=(C, k)),
            np.cumsum(g, axis=0))


# Documents: starting at row 0 only, inside the chunk, at row 63, and all three.
_DOCS = (
    ("one_document", np.zeros(C, int)),
    ("inside", np.repeat([0, 1], [23, 41])),
    ("at_row_63", np.repeat([0, 1], [63, 1])),
    ("row0_inside_row63", np.repeat([0, 1, 2, 3], [9, 30, 24, 1])),
)


class SplitTest(parameterized.TestCase):

    @parameterized.named_parameters(*_DOCS)
    def test_split_matches_dense(self, doc):
        for seed in range(3):
            for strict in (False, True):  # Mq (inclusive) and Mk (strict)
                m, x, y, gam = _inputs(seed)
                mm = masked_cotangent(m, doc, strict)
                want = dense_grads(mm, x, y, gam)
                got = split_grads(mm, x, y, gam)
                for a, e in zip(got, want):
                    np.testing.assert_allclose(a, e, rtol=1e-11, atol=1e-11 * np.abs(e).max())

    def test_every_pair_counted_once(self):
        # With gamma = 0 and Y (X) the identity over C channels, dX[i, j] (dY[j, i]) counts
        # the routes pair (i, j) takes; on the unmasked all-ones M it must be 1 for j <= i.
        eye, zero, ones = np.eye(C), np.zeros((C, C)), np.ones((C, C))
        want = np.tril(ones)
        dx, _ = split_grads(np.tril(ones), zero, eye, zero)
        _, dy = split_grads(np.tril(ones), eye, zero, zero)
        np.testing.assert_array_equal(dx, want)
        np.testing.assert_array_equal(dy.T, want)

    def test_band_of_seven_fails(self):
        m, x, y, gam = _inputs(0)
        mm = masked_cotangent(m, np.zeros(C, int), False)
        want = dense_grads(mm, x, y, gam)
        got = split_grads(mm, x, y, gam, band=HALF - 1)
        self.assertFalse(np.allclose(got[0], want[0]))
        self.assertFalse(np.allclose(got[1], want[1]))
        eye, zero, ones = np.eye(C), np.zeros((C, C)), np.ones((C, C))
        dx, _ = split_grads(np.tril(ones), zero, eye, zero, band=HALF - 1)
        self.assertEqual(dx[7, 0], 0.0)  # pair (7, 0): in no route

    def test_reference_at_first_row_has_positive_exponents(self):
        m, x, y, gam = _inputs(1)
        mm = masked_cotangent(m, np.zeros(C, int), False)
        with self.assertRaisesRegex(AssertionError, "positive exponent"):
            split_grads(mm, x, y, gam, ref_row=0)

    @parameterized.named_parameters(*_DOCS[1:])
    def test_dropped_document_mask_fails(self, doc):
        m, x, y, gam = _inputs(2, strong=False)
        want = dense_grads(masked_cotangent(m, doc, False), x, y, gam)
        got = split_grads(masked_cotangent(m, doc, False, doc_mask=False), x, y, gam)
        self.assertFalse(np.allclose(got[0], want[0]))
        self.assertFalse(np.allclose(got[1], want[1]))


if __name__ == "__main__":
    absltest.main()
