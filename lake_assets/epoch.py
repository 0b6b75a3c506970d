"""Moments as numbers: milliseconds (or seconds) since the Unix epoch, as catalog records and
vendors' files give them."""

#: one hour in milliseconds
HOUR_MS = 3_600_000
#: one UTC day in milliseconds
DAY_MS = 86_400_000
#: an epoch number beyond this (in magnitude) is milliseconds, otherwise seconds: 1e11 seconds is
#: the year 5138, 1e11 milliseconds March 1973. Moments from then on read right either way;
#: milliseconds before it pass for seconds (a GRAX time copy is checked against its field's text)
EPOCH_MS_THRESHOLD = 100_000_000_000
#: the largest epoch in milliseconds that Spark's timestamps (64-bit microseconds) can hold
LARGEST_EPOCH_MS = (2**63 - 1) // 1000
