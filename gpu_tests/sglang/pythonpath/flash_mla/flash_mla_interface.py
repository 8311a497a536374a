"""See ``flash_mla/__init__.py``: the one class SGLang imports by name from here."""


class FlashMLASchedMeta:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("flash_mla stand-in: FlashMLASchedMeta needs the real FlashMLA package")
