/* libnvidia-ml.so.1 for machines without a GPU: NVML's C API answered from a recorded nvidia-smi stream.
 *
 * The recording (the file named by NVML_REPLAY_FILE, read at the first nvmlInit) is what
 *   nvidia-smi --query-gpu=timestamp,index,uuid,name,utilization.gpu,utilization.memory,memory.used,
 *              memory.total,power.draw,temperature.gpu,clocks.sm --format=csv,nounits -lms 1000
 * writes: a header (units in brackets), then one row per GPU per tick; "[N/A]" (any value that is not a number)
 * makes that metric NVML_ERROR_NOT_SUPPORTED. Devices are numbered in order of first appearance of their index.
 *
 * Replay: each device has a cursor over its own rows. nvmlDeviceGetUtilizationRates moves it to the next row
 * (the first call reads row 0, at the last row it stays) and reads it; every other getter reads the row under
 * the cursor (row 0 before the first utilisation call). Energy is the recorded power integrated over the
 * recorded timestamps since the first row: trapezoids between rows of known power, across "[N/A]" rows.
 *
 * Three optional columns (a recording without them reads as a device without ECC, Xid events or recovery action):
 *   ecc.errors.uncorrected.volatile.total  nvidia-smi's own field: nvmlDeviceGetTotalEccErrors (uncorrected, volatile)
 *   xid                                    an Xid error at that tick (as the kernel log's "NVRM: Xid" line says);
 *                                          "[N/A]" for none. When the utilisation call moves a device's cursor onto
 *                                          such a row, an event nvmlEventTypeXidCriticalError is queued for every
 *                                          event set the device is registered with (nvmlEventSetWait_v2 reads it).
 *   recovery_action                        the GPU's recovery action at that tick: the value of the field
 *                                          NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (an nvmlDeviceGpuRecoveryAction_t:
 *                                          0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, ...),
 *                                          read with nvmlDeviceGetFieldValues; "[N/A]": the driver does not give it.
 */
#define _DEFAULT_SOURCE /* timegm */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
typedef enum { NVML_TEMPERATURE_GPU = 0, NVML_TEMPERATURE_COUNT } nvmlTemperatureSensors_t;
typedef enum { NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_VIDEO, NVML_CLOCK_COUNT } nvmlClockType_t;
#define REPLAY_VERSION "replay"

/* The recording's columns, by their header names without units; each value in NVML's unit once loaded. */
enum { TIMESTAMP, INDEX, UUID, NAME, UTIL_GPU, UTIL_MEMORY, MEMORY_USED, MEMORY_TOTAL, POWER, TEMPERATURE, CLOCK_SM,
       REQUIRED, ECC_UNCORRECTED = REQUIRED, XID, RECOVERY_ACTION, COLUMNS }; /* from REQUIRED on: optional */
static const char *const COLUMN_NAMES[COLUMNS] = {
    "timestamp", "index", "uuid", "name", "utilization.gpu", "utilization.memory", "memory.used", "memory.total",
    "power.draw", "temperature.gpu", "clocks.sm", "ecc.errors.uncorrected.volatile.total", "xid", "recovery_action"};
static const double SCALE[COLUMNS] = {[MEMORY_USED] = 1048576, [MEMORY_TOTAL] = 1048576, [POWER] = 1000,
                                      [UTIL_GPU] = 1, [UTIL_MEMORY] = 1, [TEMPERATURE] = 1, [CLOCK_SM] = 1,
                                      [ECC_UNCORRECTED] = 1, [XID] = 1, [RECOVERY_ACTION] = 1};
#define XID_CRITICAL_ERROR 0x8ULL /* nvmlEventTypeXidCriticalError */
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
typedef enum { NVML_VALUE_TYPE_DOUBLE = 0, NVML_VALUE_TYPE_UNSIGNED_INT = 1 } nvmlValueType_t;
typedef union { double dVal; unsigned int uiVal; unsigned long ulVal; unsigned long long ullVal;
                signed long long sllVal; signed int siVal; unsigned short usVal; } nvmlValue_t;
typedef struct { unsigned int fieldId, scopeId; long long timestamp, latencyUsec; nvmlValueType_t valueType;
                 nvmlReturn_t nvmlReturn; nvmlValue_t value; } nvmlFieldValue_t;

typedef struct { double value[COLUMNS], energy_mj; } Row; /* value NAN: not supported; energy: a running total */

struct nvmlDevice_st {
    char index[32], uuid[96], name[96];
    Row *rows;
    size_t count;
    long cursor, known; /* known: the last row with a power */
    unsigned int watched; /* event sets registered for its Xid events */
};
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId,
                 computeInstanceId; } nvmlEventData_t;
#define PENDING 64
struct nvmlEventSet_st { nvmlEventData_t pending[PENDING]; unsigned int head, count; };
typedef struct nvmlEventSet_st *nvmlEventSet_t;
static nvmlEventSet_t event_sets[8]; /* the sets created and not freed */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int init_count;
static struct nvmlDevice_st *devices;
static unsigned int device_count;

static void unload(void) {
    for (unsigned int i = 0; i < device_count; i++) free(devices[i].rows);
    free(devices);
    devices = NULL;
    device_count = 0;
}

static char *trim(char *text) {
    while (*text == ' ' || *text == '\t') text++;
    size_t n = strlen(text);
    while (n && strchr(" \t\r\n", text[n - 1])) text[--n] = '\0';
    return text;
}

static int split(char *line, char **fields, int most) { /* nvidia-smi never quotes: names hold no comma */
    int n = 0;
    for (char *field = strtok(line, ","); field && n < most; field = strtok(NULL, ",")) fields[n++] = trim(field);
    return n;
}

static double milliseconds(const char *text) { /* "2024/05/14 10:21:33.123" (local time: only differences count) */
    struct tm tm = {0};
    int ms = 0, end = 0;
    if (sscanf(text, "%d/%d/%d %d:%d:%d%n.%d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
               &tm.tm_sec, &end, &ms, &end) < 6 || text[end] != '\0')
        return NAN;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) * 1000 + ms;
}

static double number(const char *text) {
    char *end;
    double value = strtod(text, &end);
    return end == text || *trim(end) ? NAN : value;
}

static struct nvmlDevice_st *device_for(char **fields, const int *at) {
    for (unsigned int i = 0; i < device_count; i++)
        if (!strcmp(devices[i].index, fields[at[INDEX]])) return &devices[i];
    struct nvmlDevice_st *grown = realloc(devices, (device_count + 1) * sizeof *devices);
    if (!grown) return NULL;
    devices = grown;
    struct nvmlDevice_st *device = memset(&devices[device_count++], 0, sizeof *devices);
    snprintf(device->index, sizeof device->index, "%s", fields[at[INDEX]]);
    snprintf(device->uuid, sizeof device->uuid, "%s", fields[at[UUID]]);
    snprintf(device->name, sizeof device->name, "%s", fields[at[NAME]]);
    device->cursor = device->known = -1;
    return device;
}

static int add_row(char **fields, const int *at) {
    struct nvmlDevice_st *device = device_for(fields, at);
    Row *rows = device ? realloc(device->rows, (device->count + 1) * sizeof *rows) : NULL;
    if (!rows) return 0;
    device->rows = rows;
    Row *row = &rows[device->count++];
    row->value[TIMESTAMP] = milliseconds(fields[at[TIMESTAMP]]);
    for (int c = UTIL_GPU; c < COLUMNS; c++) row->value[c] = at[c] < 0 ? NAN : number(fields[at[c]]) * SCALE[c];
    row->energy_mj = device->count > 1 ? row[-1].energy_mj : 0;
    if (!isnan(row->value[POWER])) {
        if (device->known >= 0) { /* mW x ms / 1000 = mJ */
            const Row *last = &rows[device->known];
            row->energy_mj += (last->value[POWER] + row->value[POWER]) / 2
                              * (row->value[TIMESTAMP] - last->value[TIMESTAMP]) / 1000;
        }
        device->known = (long)device->count - 1;
    }
    return !isnan(row->value[TIMESTAMP]);
}

static nvmlReturn_t load(void) {
    const char *path = getenv("NVML_REPLAY_FILE");
    FILE *file = path && *path ? fopen(path, "r") : NULL;
    if (!file) {
        fprintf(stderr, "nvml_replay: cannot read NVML_REPLAY_FILE=%s\n", path ? path : "(unset)");
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    char *line = NULL, *fields[64];
    size_t size = 0;
    int at[COLUMNS], columns = 0, number_of_line = 0, ok = 1;
    while (ok && getline(&line, &size, file) > 0) {
        number_of_line++;
        char *text = trim(line);
        if (!*text) continue;
        if (!strncmp(text, "timestamp", 9)) { /* the header (again, when a recording was appended to) */
            columns = split(text, fields, 64);
            for (int f = 0; f < columns; f++) fields[f][strcspn(fields[f], " [")] = '\0'; /* "memory.used [MiB]" */
            for (int c = 0; c < COLUMNS && ok; c++) {
                at[c] = -1;
                for (int f = 0; f < columns; f++)
                    if (!strcmp(fields[f], COLUMN_NAMES[c])) at[c] = f;
                ok = at[c] >= 0 || c >= REQUIRED;
            }
        } else {
            ok = columns && split(text, fields, 64) == columns && add_row(fields, at);
        }
    }
    free(line);
    fclose(file);
    if (ok && device_count) return NVML_SUCCESS;
    fprintf(stderr, "nvml_replay: %s, line %d: not a recording of the columns %s,%s,...,%s\n", path, number_of_line,
            COLUMN_NAMES[0], COLUMN_NAMES[1], COLUMN_NAMES[COLUMNS - 1]);
    unload();
    return NVML_ERROR_LIBRARY_NOT_FOUND;
}

/* ------------------------------------------------------------------------------------------- the API */
nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t result = init_count ? NVML_SUCCESS : load();
    init_count += result == NVML_SUCCESS;
    pthread_mutex_unlock(&lock);
    return result;
}
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t result = init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count && !--init_count) unload();
    pthread_mutex_unlock(&lock);
    return result;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* Every call below holds the lock from enter() to leave(). */
static nvmlReturn_t enter(nvmlDevice_t device, const void *out) {
    pthread_mutex_lock(&lock);
    if (!init_count) return NVML_ERROR_UNINITIALIZED;
    if (!out || (device && (device < devices || device >= devices + device_count))) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}
static nvmlReturn_t leave(nvmlReturn_t result) {
    pthread_mutex_unlock(&lock);
    return result;
}
#define ENTER(device, out)                                                                                             \
    do {                                                                                                               \
        nvmlReturn_t entered = enter(device, out);                                                                     \
        if (entered != NVML_SUCCESS) return leave(entered);                                                            \
    } while (0)

static nvmlReturn_t text(char *out, unsigned int length, const char *value) {
    if (strlen(value) >= length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

static const Row *current(nvmlDevice_t device) { return &device->rows[device->cursor < 0 ? 0 : device->cursor]; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER(NULL, version);
    return leave(text(version, length, REPLAY_VERSION));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    ENTER(NULL, version);
    return leave(text(version, length, REPLAY_VERSION));
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER(NULL, count);
    *count = device_count;
    return leave(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER(NULL, device);
    if (index >= device_count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &devices[index];
    return leave(NVML_SUCCESS);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    ENTER(NULL, device);
    if (!uuid) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned int i = 0; i < device_count; i++)
        if (!strcmp(devices[i].uuid, uuid)) {
            *device = &devices[i];
            return leave(NVML_SUCCESS);
        }
    return leave(NVML_ERROR_NOT_FOUND);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    ENTER(device, index);
    *index = (unsigned int)(device - devices);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER(device, uuid);
    return leave(text(uuid, length, device->uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER(device, name);
    return leave(text(name, length, device->name));
}

static nvmlReturn_t memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *free) {
    const Row *row = current(device);
    if (isnan(row->value[MEMORY_TOTAL]) || isnan(row->value[MEMORY_USED])) return NVML_ERROR_NOT_SUPPORTED;
    *total = (unsigned long long)row->value[MEMORY_TOTAL];
    *free = *total - (unsigned long long)row->value[MEMORY_USED];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *out) {
    ENTER(device, out);
    nvmlReturn_t result = memory(device, &out->total, &out->free);
    if (result == NVML_SUCCESS) out->used = out->total - out->free;
    return leave(result);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *out) {
    ENTER(device, out);
    if (out->version != nvmlMemory_v2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    nvmlReturn_t result = memory(device, &out->total, &out->free);
    if (result == NVML_SUCCESS) {
        out->reserved = 0; /* nvidia-smi's memory.used is all that is not free */
        out->used = out->total - out->free;
    }
    return leave(result);
}

static void queue_xid(nvmlDevice_t device) { /* the row under the cursor records an Xid: tell the sets watching */
    double xid = current(device)->value[XID];
    for (unsigned int s = 0; !isnan(xid) && s < sizeof event_sets / sizeof *event_sets; s++) {
        nvmlEventSet_t set = event_sets[s];
        if (!set || !(device->watched & (1u << s)) || set->count == PENDING) continue;
        nvmlEventData_t *event = &set->pending[(set->head + set->count++) % PENDING];
        *event = (nvmlEventData_t){device, XID_CRITICAL_ERROR, (unsigned long long)xid, 0xFFFFFFFF, 0xFFFFFFFF};
    }
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    ENTER(device, utilization);
    if (device->cursor + 1 < (long)device->count) {
        device->cursor++;
        queue_xid(device);
    }
    const Row *row = current(device);
    if (isnan(row->value[UTIL_GPU]) || isnan(row->value[UTIL_MEMORY])) return leave(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = (unsigned int)row->value[UTIL_GPU];
    utilization->memory = (unsigned int)row->value[UTIL_MEMORY];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t whole(nvmlDevice_t device, int column, unsigned int *out) {
    double value = current(device)->value[column];
    if (isnan(value)) return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)(value + 0.5);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    ENTER(device, power);
    return leave(whole(device, POWER, power));
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned int *temperature) {
    ENTER(device, temperature);
    if (sensor != NVML_TEMPERATURE_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    return leave(whole(device, TEMPERATURE, temperature));
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    ENTER(device, clock);
    if ((unsigned int)type >= NVML_CLOCK_COUNT) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (type != NVML_CLOCK_SM) return leave(NVML_ERROR_NOT_SUPPORTED); /* only the SM clock is recorded */
    return leave(whole(device, CLOCK_SM, clock));
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    ENTER(device, energy);
    const Row *row = current(device);
    if (isnan(row->value[POWER])) return leave(NVML_ERROR_NOT_SUPPORTED);
    *energy = (unsigned long long)(row->energy_mj + 0.5);
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                         unsigned long long *count) {
    ENTER(device, count);
    double value = current(device)->value[ECC_UNCORRECTED];
    if (errorType != 1 || counterType != 0 || isnan(value)) return leave(NVML_ERROR_NOT_SUPPORTED); /* recorded: */
    *count = (unsigned long long)value; /* the uncorrected volatile count alone */
    return leave(NVML_SUCCESS);
}

/* Field values: only the recovery action is recorded; every other field is NOT_SUPPORTED, in its own nvmlReturn. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    ENTER(device, values);
    if (valuesCount < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    double action = current(device)->value[RECOVERY_ACTION];
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *field = &values[i];
        field->timestamp = (long long)current(device)->value[TIMESTAMP] * 1000; /* microseconds */
        field->latencyUsec = 0;
        field->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        field->value.ullVal = 0;
        field->nvmlReturn = field->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION && !isnan(action)
                                ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
        if (field->nvmlReturn == NVML_SUCCESS) field->value.uiVal = (unsigned int)action;
    }
    return leave(NVML_SUCCESS);
}

/* Events: only Xid critical errors are recorded. A set is freed by nvmlEventSetFree (or left with the process). */
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER(NULL, set);
    for (unsigned int s = 0; s < sizeof event_sets / sizeof *event_sets; s++)
        if (!event_sets[s]) {
            *set = event_sets[s] = calloc(1, sizeof **set);
            return leave(*set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
        }
    return leave(NVML_ERROR_UNKNOWN);
}

static int set_slot(nvmlEventSet_t set) {
    for (unsigned int s = 0; set && s < sizeof event_sets / sizeof *event_sets; s++)
        if (event_sets[s] == set) return (int)s;
    return -1;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    ENTER(device, set);
    int slot = set_slot(set);
    if (slot < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~XID_CRITICAL_ERROR) return leave(NVML_ERROR_NOT_SUPPORTED); /* nothing else is recorded */
    device->watched |= 1u << slot;
    return leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    (void)timeoutms; /* a replay has no later: what is not queued now never comes */
    ENTER(NULL, data);
    if (set_slot(set) < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!set->count) return leave(NVML_ERROR_TIMEOUT);
    *data = set->pending[set->head];
    set->head = (set->head + 1) % PENDING;
    set->count--;
    return leave(NVML_SUCCESS);
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&lock);
    int slot = set_slot(set);
    if (slot >= 0) {
        for (unsigned int i = 0; i < device_count; i++) devices[i].watched &= ~(1u << slot);
        event_sets[slot] = NULL;
        free(set);
    }
    return leave(slot >= 0 ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT);
}
