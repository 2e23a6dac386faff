"""What the tests share: the test world, the throwaway user, the sandgate runner, fakes and probes."""
