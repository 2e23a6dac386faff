"""What both guards stand on: the policy error with its FILE:LINE origin, the Windows API binding."""
