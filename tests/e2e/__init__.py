"""End-to-end tests: the real CLI inside disposable test worlds, as root and as a throwaway user."""
