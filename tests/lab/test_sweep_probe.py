"""The sweep's builder reaches the families the generic small config did not fit (issue 11).

hotfix_lab.sweep.sweep_probe builds each model type (generic shrink + tools/hotfix_lab/sweep/sweep_families) and runs one
forward + backward without checkpointing.  Before the family modules, every type below failed
to build or run on the releases listed (patch grids, tiles and aspect ratios, MLA head sizes,
Mamba mixers, hierarchical stages, audio front ends, see docs/sweep.md); measured 2026-11-23 over
every checkpointable type: 281/286 (4.56.2), 296/301 (4.57.6), 503/509 (5.23.0) build and step
(the rest cannot be built here: docs/sweep-reach.md).
"""

from __future__ import annotations

import re

from conftest import matrix_path, run_python

# one or two per family module, present on both lines
TYPES = ["qwen2_vl", "qwen2_5_vl", "glm4v", "llava_next", "mllama", "idefics3", "gemma3", "swin", "videomae",
         "deepseek_v3", "falcon_h1", "speecht5", "wav2vec2-bert", "audio-spectrogram-transformer", "clvp"]
# entries added for 5.x-only types (not in 4.56.2's registry): MiniCPM-V packed NaViT pixels, NemotronH
# hybrid layers under an audio LM, MLA/linear-attention hybrids, GLM-5 text
NEWER = ["minicpmv4_7", "minicpm_ocr", "nemo_speechlm", "bailing_hybrid", "glm5_next_text"]


def test_probe_builds_and_steps_every_family_on_4_and_5():
    for version in ("4.56.2", "5.23.0"):
        matrix_path("transformers", version)
    proc = run_python(["-P", "-m", "hotfix_lab.sweep.sweep_probe", "--versions", "4.56.2,5.23.0",
                       "--models", ",".join(TYPES + NEWER), "--memory", "6"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reach = dict(re.findall(r"^reach (\S+): (\d+/\d+)", proc.stdout, re.M))
    both, newer = len(TYPES), len(TYPES) + len(NEWER)
    assert reach == {"4.56.2": f"{both}/{both}", "5.23.0": f"{newer}/{newer}"}, proc.stdout
