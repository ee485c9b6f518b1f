"""DeepSeek-OCR-2 / Unlimited-OCR, a neighbour of the patch-grid GLM family (``vision_grid_glm``) with
another image layout: whole images go through a SAM encoder and a second encoder with learnt queries.
The sizes of the two encoders must agree, the multimodal token ids must fit the shrunk vocabulary, and
the text needs as many image placeholders as the model makes features.  The facts come from
transformers' own ModelTesters.
"""

from __future__ import annotations

from ._vision_grid_glm_common import _first, fix_token_ids, text_ids


def fix_deepseek_ocr(config):
    """DeepSeek-OCR-2 / Unlimited-OCR: a SAM encoder (windowed + global layers, a neck that downsamples twice
    to ``downsample_channels``) feeds a second encoder with learnt queries; sizes from the ModelTester."""
    vision, text = config.vision_config, config.text_config
    sam = vision.sam_config
    for key, value in (("hidden_size", 32), ("output_channels", 16), ("num_hidden_layers", 2), ("image_size", 16),
                       ("patch_size", 2), ("window_size", 4), ("global_attn_indexes", [1])):
        if hasattr(sam, key):
            setattr(sam, key, value)
    encoder = vision.encoder_config
    # the second encoder reads the SAM neck's last feature map as its tokens: same width
    sam.downsample_channels = [encoder.hidden_size // 2, encoder.hidden_size]
    if hasattr(encoder, "layer_types") and encoder.layer_types is not None:
        encoder.layer_types = encoder.layer_types[:encoder.num_hidden_layers]
    layers = text.num_hidden_layers
    if hasattr(text, "mlp_layer_types"):
        text.mlp_layer_types = ["dense", "sparse"][:layers]  # one dense MLP, one MoE
    if getattr(text, "num_experts_per_tok", 0) is None:  # None by default: the router's top-k needs a number
        text.num_experts_per_tok = 1
    # SAM's default init (std 1e-10) leaves its layers with vanishing gradients: use the usual std
    sam.initializer_range = 0.02
    if getattr(text, "layer_types", None) is not None:
        text.layer_types = text.layer_types[:layers]
    fix_token_ids(config)


def sam_ocr_batch(model, config, generator):
    """DeepSeek-OCR style: whole images at the SAM encoder's size, text with as many image placeholders as the
    model makes features (learnt from the model's own mismatch error by ``sweep_inputs.fit_image_tokens``)."""
    import torch
    from hotfix_lab.sweep.sweep_inputs import fit_image_tokens

    sam = config.vision_config.sam_config
    size = _first(sam.image_size)
    batch = {"input_ids": text_ids(config, generator),
             "pixel_values": torch.randn(2, sam.num_channels, size, size, generator=generator)}
    batch = fit_image_tokens(model, config, batch)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    return batch


CONFIGS = {
    "deepseek_ocr2": fix_deepseek_ocr,
    "unlimited_ocr": fix_deepseek_ocr,
}

INPUTS = {
    "deepseek_ocr2": sam_ocr_batch,
    "unlimited_ocr": sam_ocr_batch,
}
