"""OCR and document models: the PP-OCR text-line recognisers (PP-OCRv5 mobile / server, PP-OCRv6
small) and the UVDoc page unwarper.

What the generic shrink cannot guess here: their CNN backbones keep per-stage block lists that must
leave enough rows for the recognition head's pooling (text lines are short and wide), and UVDoc's
head reads every bridge stage of its backbone.
"""

from __future__ import annotations

from ._vision_common import _pixels


# --- PP-OCR text-line recognisers: a CNN backbone, then a (3, 2) average pool of its last map, so the
# backbone must leave at least 3 rows.  Text lines are short and wide (48 x 64 here); recognition
# backbones downsample the height more than the width (strides [2, 1]).  Each backbone keeps its
# stage count (its out_features stay valid) with one or two narrow blocks per stage.
_OCR_LINE = (48, 64)


def _ocr_lcnet_v3(config):
    # PP-OCRv5 mobile: LCNetV3, block = [kernel, in, out, stride, use_se]; widths scale by ``scale``
    # rounded to ``divisor``.  The default block list is the detector's (stride 2 everywhere: a
    # 48-pixel line ends at 1 row); these are recognition strides, height / 16 and width / 4.
    bb = config.backbone_config
    bb.stem_channels = 16
    bb.block_configs = [
        [[3, 16, 16, 1, False]],
        [[3, 16, 32, 1, False]],
        [[3, 32, 32, [2, 1], False]],
        [[3, 32, 32, [1, 2], False], [5, 32, 32, 1, False]],
        [[5, 32, 32, [2, 1], True], [5, 32, 32, [2, 1], False]],
    ]
    bb.depths = [len(stage) for stage in bb.block_configs]


def _ocr_hgnet_v2(config):
    # PP-OCRv5 server: HGNetV2 stages (in / mid / out channels, blocks, layers per block)
    bb = config.backbone_config
    bb.stem_channels = [3, 16, 16]
    bb.stage_in_channels, bb.stage_mid_channels = [16, 32, 32, 64], [16, 16, 32, 32]
    bb.stage_out_channels = [32, 32, 64, 64]
    bb.stage_num_blocks, bb.stage_numb_of_layers = [1, 1, 1, 1], [2, 2, 2, 2]
    bb.embedding_size, bb.hidden_sizes, bb.depths = 16, list(bb.stage_out_channels), [1, 1, 1, 1]


def _ocr_lcnet_v4(config):
    # PP-OCRv6 small: LCNetV4 (stem strides 2 then 2: height and width / 4; two [2, 1] stages: height / 16)
    bb = config.backbone_config
    bb.stem_channels = [3, 16, 16]
    bb.block_configs = [
        [[3, 16, 16, 1, True]],
        [[3, 16, 16, 1, False]],
        [[3, 16, 32, [2, 1], False], [3, 32, 32, 1, True]],
        [[3, 32, 32, [2, 1], False]],
    ]
    bb.depths = [len(stage) for stage in bb.block_configs]
    bb.stage_out_channels = [stage[-1][2] for stage in bb.block_configs]


def _ocr_batch(model, config, generator):
    return {"pixel_values": _pixels(2, 3, *_OCR_LINE, generator=generator)}


def _uvdoc(config):
    """UVDoc: a strided ResNet, then parallel dilated-conv "bridges" over its output whose feature maps
    are all concatenated for the head: the head's ``bridge_connector`` input is (bridge width x number
    of bridges), so every bridge stage must be an output (the default lists only the last one).
    A 64-pixel page leaves a 4x4 map after strides 2, 2, 2, 2 (the head pads it by reflection,
    which needs more than kernel_size // 2 = 2 pixels)."""
    bb = config.backbone_config
    for owner in (config, bb):
        if hasattr(owner, "kernel_size"):
            owner.kernel_size = 5
    bb.resnet_head = [[3, 8], [8, 8]]
    bb.resnet_configs = [[[8, 8, 1, False]], [[8, 16, 1, True]], [[16, 16, 1, True]]]
    bb.stage_configs = [[[16, 1]], [[16, 2]], [[16, 4], [16, 2]]]
    bb.depths = [len(stage) for stage in bb.stage_configs]
    bb.stage_names = ["stem"] + [f"stage{i}" for i in range(1, len(bb.stage_configs) + 1)]
    bb.out_features = bb.stage_names[1:]
    config.bridge_connector = [16, 16]
    config.out_point_positions2D = [[16, 8], [8, 2]]


CONFIGS = {
    "pp_ocrv5_mobile_rec": _ocr_lcnet_v3,
    "pp_ocrv5_server_rec": _ocr_hgnet_v2,
    "pp_ocrv6_small_rec": _ocr_lcnet_v4,
    "uvdoc": _uvdoc,
}

INPUTS = {
    "pp_ocrv5_mobile_rec": _ocr_batch,
    "pp_ocrv5_server_rec": _ocr_batch,
    "pp_ocrv6_small_rec": _ocr_batch,
    "uvdoc": lambda model, config, g: {"pixel_values": _pixels(2, 3, 64, generator=g)},
}
