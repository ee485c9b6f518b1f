"""The activation offloader of unsloth-zoo-offload-backward: its state (``offloader``) and its devices (``devices``)."""
