/*
 * dlsym_next.c - checks libvgpu.so's dlsym entry as a program sees it: RTLD_NEXT must stay relative to the caller
 * (the entry tail-jumps to glibc, so glibc sees this program's return address), other handles go through the
 * library's lookup.  Needs no GPU driver.  Prints key=value lines; exit status 0 when all hold.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    /* the object after this program in the global scope is the preloaded libvgpu.so, which defines cuInit */
    void *next = dlsym(RTLD_NEXT, "cuInit");
    void *dflt = dlsym(RTLD_DEFAULT, "cuInit");
    void *libc = dlopen("libc.so.6", RTLD_NOW);
    void *by_handle = libc ? dlsym(libc, "strlen") : NULL;
    int next_ok = next != NULL && next == dflt;
    int handle_ok = by_handle == (void *)strlen;
    printf("next=%d\nhandle=%d\n", next_ok, handle_ok);
    return !(next_ok && handle_ok);
}
