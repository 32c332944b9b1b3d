/*
 * version.c — ib_version: the library's own version, for programs that link it dynamically and
 * want to know which one they got (the header's IB_VERSION_STRING is the one they compiled with).
 */
#include "isobatch.h"

const char *ib_version(void) { return IB_VERSION_STRING; }
