"""Video encoders (TimeSformer, VideoMAE, ViViT, V-JEPA 2, VideoPrism) and the Perception Encoder
video / audio-video encoders and their contrastive models (PE-Video, PE-Audio-Video).

What the generic shrink cannot guess here: video models take ``(batch, frames, channels, height,
width)`` with ``num_frames`` a multiple of the tubelet depth and the frame size a multiple of the
tubelet / patch size; the PE models' released vision tower is timm's, which cannot be imported here
(timm needs torchvision), so it is replaced by a small transformers ViT, and their batches add text
and ``return_loss`` so that the contrastive loss reaches every tower.
"""

from __future__ import annotations


def _video_batch(config, name="pixel_values", frames=None, generator=None):
    """(batch, frames, channels, height, width): the frame count and size the config was fixed to."""
    import torch

    size = getattr(config, "image_size", None) or getattr(config, "crop_size", 32)
    size = size[0] if isinstance(size, (list, tuple)) else size
    frames = frames or getattr(config, "num_frames", None) or getattr(config, "frames_per_clip", 4)
    channels = getattr(config, "num_channels", None) or getattr(config, "in_chans", 3)
    return {name: torch.randn(2, frames, channels, size, size, generator=generator)}


_FRAMES = 4  # a multiple of every tubelet depth used below (2), so that no frame is dropped


def _timesformer(config):
    # 4 frames of 32x32 in 8-pixel patches; time embeddings are sized by num_frames
    config.num_frames, config.image_size, config.patch_size = _FRAMES, 32, 8


def _videomae(config):
    # tubelets of 2 frames x 8x8 pixels; the (unused by the base model) pretraining decoder kept tiny too
    config.num_frames, config.tubelet_size, config.image_size, config.patch_size = _FRAMES, 2, 32, 8
    config.decoder_hidden_size, config.decoder_intermediate_size = 32, 64
    config.decoder_num_attention_heads, config.decoder_num_hidden_layers = 2, 1


def _vivit(config):
    # tubelet (frames, height, width) must divide (num_frames, image_size, image_size)
    config.num_frames, config.image_size, config.tubelet_size = _FRAMES, 32, [2, 8, 8]
    config.pooler_output_size = config.hidden_size


def _vjepa2(config):
    # the patch grid is sized by crop_size and frames_per_clip (not image_size / num_frames);
    # the predictor and attentive pooler have their own sizes that the shrink does not know
    config.crop_size, config.frames_per_clip, config.tubelet_size, config.patch_size = 32, _FRAMES, 2, 8
    if hasattr(config, "image_size"):
        config.image_size = 32
    config.pred_hidden_size, config.pred_num_attention_heads, config.pred_num_hidden_layers = 32, 2, 1
    if hasattr(config, "num_pooler_layers"):
        config.num_pooler_layers = 1


def _videoprism_vision(config):
    # factorised encoder: spatial layers over 8x8 tubelet patches of each frame, temporal layers
    # over num_frames (position embeddings sized by both), plus auxiliary layers for the clip head
    config.num_frames, config.image_size, config.tubelet_size = _FRAMES, 32, [1, 8, 8]
    config.num_spatial_layers, config.num_temporal_layers = 1, 1
    if hasattr(config, "num_auxiliary_layers"):
        config.num_auxiliary_layers = 1


def _videoprism(config):
    _videoprism_vision(config.vision_config)


def _videoprism_clip_batch(model, config, generator):
    import torch

    batch = _video_batch(config.vision_config, "pixel_values_videos", generator=generator)
    batch["input_ids"] = torch.randint(1, config.text_config.vocab_size, (2, 8), generator=generator)
    batch["return_loss"] = True  # the contrastive loss: both towers in the backward
    return batch


def _pe_video_encoder(config):
    """PE video encoder: a per-frame image classifier (``AutoModelForImageClassification`` of
    ``vision_config``) whose logits are projected to the encoder.  The released tower is timm's
    vit_pe_core (TimmWrapperConfig); timm cannot be imported here, so the tower is a tiny
    transformers ViT classifier, which fills the same slot (frames in, ``logits`` of
    ``num_labels`` out).  The encoder transformer itself, the part checkpointing wraps, is unchanged."""
    from transformers import ViTConfig

    config.vision_config = ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=16,
                                     num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                     num_labels=16)


def _pe_audio_encoder(config):
    # the DAC codec front end: hop = product of downsampling_ratios samples per audio frame, channel
    # width doubling per ratio from encoder_hidden_size; it runs under no_grad (a frozen codec)
    dac = config.dac_config
    dac.encoder_hidden_size, dac.downsampling_ratios, dac.hidden_size, dac.codebook_dim = 4, [2, 4], 16, 8
    if hasattr(dac, "upsampling_ratios"):
        dac.upsampling_ratios = [4, 2]
    if hasattr(dac, "decoder_hidden_size"):
        dac.decoder_hidden_size = 16
    if hasattr(dac, "n_codebooks"):
        dac.n_codebooks, dac.codebook_size = 2, 16
    dac.hop_length = 8


def _pe_audio_video_encoder(config):
    _pe_video_encoder(config.video_config)
    _pe_audio_encoder(config.audio_config)


_PE_SAMPLES = 64  # audio samples: 8 frames at the DAC hop of 8


def _pe_video_encoder_batch(model, config, generator):
    return _video_batch(config.vision_config, "pixel_values_videos", frames=_FRAMES, generator=generator)


def _pe_audio_video_encoder_batch(model, config, generator):
    import torch

    batch = _pe_video_encoder_batch(model, config.video_config, generator)
    batch["input_values"] = torch.randn(2, 1, _PE_SAMPLES, generator=generator)
    return batch


def _with_text(make, sub):
    """A PE model's batch: its encoder's inputs (from sub-config ``sub``) plus text for the contrastive
    heads, and ``return_loss`` so that the loss is the model's own contrastive loss over all towers
    (the first output alone would leave most of them out of the backward)."""
    def batch(model, config, generator):
        import torch

        out = make(model, getattr(config, sub), generator)
        out["input_ids"] = torch.randint(2, config.text_config.vocab_size, (2, 8), generator=generator)
        out["return_loss"] = True
        return out
    return batch


CONFIGS = {
    "timesformer": _timesformer,
    "videomae": _videomae,
    "vivit": _vivit,
    "vjepa2": _vjepa2,
    "videoprism_vision_model": _videoprism_vision,
    "videoprism": _videoprism,
    "pe_video_encoder": _pe_video_encoder,
    "pe_video": lambda config: _pe_video_encoder(config.video_config),
    "pe_audio_video_encoder": _pe_audio_video_encoder,
    "pe_audio_video": lambda config: _pe_audio_video_encoder(config.audio_video_config),
}

INPUTS = {
    "timesformer": lambda model, config, g: _video_batch(config, generator=g),
    "videomae": lambda model, config, g: _video_batch(config, generator=g),
    "vivit": lambda model, config, g: _video_batch(config, generator=g),
    "vjepa2": lambda model, config, g: _video_batch(config, "pixel_values_videos", generator=g),
    "videoprism_vision_model": lambda model, config, g: _video_batch(config, "pixel_values_videos", generator=g),
    "videoprism": _videoprism_clip_batch,
    "pe_video_encoder": _pe_video_encoder_batch,
    "pe_video": _with_text(_pe_video_encoder_batch, "video_config"),
    "pe_audio_video_encoder": _pe_audio_video_encoder_batch,
    "pe_audio_video": _with_text(_pe_audio_video_encoder_batch, "audio_video_config"),
}

UNBUILDABLE = {
    # 4.56 / 4.57 only: the import fails before any build
    "perception_encoder": "MODEL_MAPPING names PerceptionEncoder, a class transformers 4.56/4.57 do not define (the "
                          "PE tower is timm's vit_pe_core via TimmWrapperConfig; timm needs torchvision, whose CPU "
                          "build for torch 2.13.0 is not on PyPI)",
}
