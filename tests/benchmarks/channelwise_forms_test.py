"""Tests of benchmarks/channelwise_forms.py in Pallas interpret mode (CPU)."""

from unittest import mock

import pytest
from absl.testing import absltest

from benchmarks import channelwise_forms
from pallas_kernels.common import channelwise_gpu


class ChannelwiseFormsTest(absltest.TestCase):

    @pytest.mark.slow  # benchmark tooling, ~19 s on 2 cores
    def test_variants_agree_and_records_are_complete(self):
        # Two variants per stage on a small shape: every variant computes the same sums (prepare
        # with prepare_k 32 in another order). The fp32 sums differ by fp32 rounding at most, but
        # several outputs are bf16 (W, U, qg, kg, Mq), where such a difference can flip one
        # rounding: the bound is one bf16 step of the largest output (2^-8 relative).
        prepare = dict(channelwise_forms.VARIANTS["prepare"])
        variants = {
            "intra": [channelwise_forms.VARIANTS["intra"][0],
                      ("tokens, 2 heads", {"intra_token_heads": 2, "intra_token": (1, 1)})],
            "prepare": [(label, prepare[label])
                        for label in ("prepare 1x3 BK 16, wu 4x3", "prepare 1x3 BK 32, wu 4x3")],
        }
        with mock.patch.dict(channelwise_forms.VARIANTS, variants):
            records = (channelwise_forms.time_variants("intra", (1, 128, 4, 64), 1, True)
                       + channelwise_forms.time_variants("prepare", (1, 128, 2, 64), 1, True))
        self.assertLen(records, 4)
        for rec in records:
            self.assertNotIn("error", rec)
            self.assertGreater(rec["ms"], 0.0)
            self.assertLessEqual(rec["max_abs_diff"], 2.0 ** -8 * rec["max_abs"], rec["variant"])
        md = channelwise_forms.markdown(records, (1, 128, 4, 64), "cmd", "cpu")
        self.assertIn("| prepare | prepare 1x3 BK 32, wu 4x3 |", md)

    def test_failed_first_variant_leaves_no_baseline(self):
        # A first variant that fails (an int knob given a string) is recorded with its error,
        # and the next variant gets no difference rather than a silent 0 against itself.
        variants = {"intra": [("broken", {"intra_token_heads": "four"}),
                              channelwise_forms.VARIANTS["intra"][0]]}
        with mock.patch.dict(channelwise_forms.VARIANTS, variants):
            records = channelwise_forms.time_variants("intra", (1, 64, 1, 64), 1, True)
        self.assertIn('ValueError: TUNING["intra_token_heads"]', records[0]["error"])
        self.assertNotIn("error", records[1])
        self.assertIsNone(records[1]["max_abs_diff"])
        md = channelwise_forms.markdown(records, (1, 64, 1, 64), "cmd", "cpu")
        self.assertIn(f"| intra | {channelwise_forms.VARIANTS['intra'][0][0]} |", md)

    def test_variants_name_tuning_entries(self):
        # Every override is a TUNING entry (mock.patch.dict would add a misspelt one silently),
        # and labels are unique (the report's rows).
        for stage, variants in channelwise_forms.VARIANTS.items():
            labels = [label for label, _ in variants]
            self.assertLen(set(labels), len(labels), stage)
            for label, overrides in variants:
                self.assertLessEqual(set(overrides), set(channelwise_gpu.TUNING), (stage, label))

    def test_bad_shape_names_the_flag(self):
        for text in ("8,4096,16", "8,4096,16,96", "a,b,c,d", "1,100,2,64"):
            with self.assertRaisesRegex(ValueError, "--shape"):
                channelwise_forms.parse_shape(text)
        self.assertEqual(channelwise_forms.parse_shape("1,64,2,128"), (1, 64, 2, 128))
        for argv in (["--shape=1,64,2"], ["--stages=intra,gamma"], ["--iters=0"]):
            with self.assertRaises(SystemExit):
                channelwise_forms.parse_args(argv)
        self.assertEqual(channelwise_forms.parse_args(["--stages=prepare"]).stages, ["prepare"])


if __name__ == "__main__":
    absltest.main()
