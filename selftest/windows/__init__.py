"""The Windows rows of `sandgate verify`: probe bodies run in a real sandbox (probebody, probeacl,
probedesktop, probenet) and the runner that drives them (verifyrun)."""
