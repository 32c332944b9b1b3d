/* placeholder main, replaced by the CLI dispatcher */
#include <stdio.h>
int main(void) { puts("isobatch"); return 0; }
