/*
 * sim_devices.c - how the simulated libcuda and libnvidia-ml enumerate SIMGPU_DEVICES (no libvgpu.so): CUDA
 * ordinals after CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES, NVML indices, and the PCI bus ids both report.
 * Prints key=value lines for tests/isolation/test_sim_device_order.py.
 */
#include <cuda.h>
#include <nvml.h>
#include <stdio.h>

int main(void) {
    int n = -1;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS) cuDeviceGetCount(&n);
    printf("cuda_init=%d\ncuda_count=%d\n", (int)r, r ? 0 : n);
    for (int i = 0; r == CUDA_SUCCESS && i < n; i++) {
        char name[96], bus[32];
        int busno = -1, sms = 0;
        CUdevice d, back = -1;
        cuDeviceGet(&d, i);
        cuDeviceGetName(name, sizeof name, d);
        cuDeviceGetAttribute(&busno, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d);
        cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
        cuDeviceGetPCIBusId(bus, sizeof bus, d);
        cuDeviceGetByPCIBusId(&back, bus);
        printf("cuda%d=%s|%d|%s|%d|%d\n", i, name, busno, bus, sms, back);
    }
    unsigned cnt = 0;
    nvmlReturn_t nr = nvmlInit_v2();
    if (nr == NVML_SUCCESS) nvmlDeviceGetCount_v2(&cnt);
    printf("nvml_count=%u\n", cnt);
    for (unsigned i = 0; i < cnt; i++) {
        nvmlDevice_t h, back = NULL;
        char name[96], uuid[96];
        nvmlPciInfo_t pci;
        nvmlDeviceGetHandleByIndex_v2(i, &h);
        nvmlDeviceGetName(h, name, sizeof name);
        nvmlDeviceGetUUID(h, uuid, sizeof uuid);
        nvmlDeviceGetPciInfo_v3(h, &pci);
        nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &back);
        printf("nvml%u=%s|%u|%s|%s|%d\n", i, name, pci.bus, pci.busId, uuid, back == h);
    }
    return 0;
}
