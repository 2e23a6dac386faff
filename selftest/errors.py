"""The one failure `sandgate verify` reports as such: the self-test itself could not run (not a probe's verdict)."""


class VerifyError(Exception):
    pass
