"""What both guards stand on, importing nothing of ours: the policy error with its FILE:LINE origin, the
record-class table (dataclasscache), the Windows API binding."""
