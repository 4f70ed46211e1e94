"""The table behind collector.vocabulary: every canonical metric and the names it goes by.

A metric line: ``name unit scope kind help...`` (``-`` for no unit); the indented line under
it lists its aliases as ``NAME[*factor]@source``, the factor turning the alias's value into
the canonical unit. Sources: ``hook`` (the in-loop hook, the framework callbacks),
``nvml`` (collector.nvml), ``dcgm`` (dcgm-exporter fields), ``host`` (collector.host),
``unit`` (the same quantity in another unit), ``export`` (names the exporter reads).
docs/metrics.md is this table in prose; keep them together.
"""

from __future__ import annotations

_TEXT = """
step_time s rank gauge wall time of one training step (its presence marks a completed step)
    step_time_s@unit step_time_seconds@unit step_time_ms*1e-3@unit
compute_ms ms rank gauge the rank's own work in a step: step time less collectives, data, checkpoint
    compute_s*1e3@unit compute_seconds*1e3@unit
data_wait_ms ms rank gauge time the rank waited for its next batch in a step
    section.data*1e3@hook data_wait*1e3@export data_wait_s*1e3@unit data_wait_seconds*1e3@unit
comm_ms ms rank gauge time in collectives in a step, the wait for the slowest rank included
    collective_time*1e3@hook comm_s*1e3@unit comm_seconds*1e3@unit
loss - rank gauge training loss of the rank's batch (NaN is reported, not missing)
grad_norm - rank gauge gradient norm after the all-reduce (what the optimizer applies)
grad_norm_local - rank gauge the rank's own gradient norm, before the all-reduce
    local_grad_norm@hook
lr - rank gauge learning rate
    learning_rate@hook
tokens count rank gauge tokens the rank trained on in the step
tokens_per_s 1/s rank gauge tokens per second of the rank
skipped_step 0/1 rank gauge 1 when the optimizer step was skipped (non-finite gradient)
in_collective s rank event seconds waited in an open collective (> 0 waiting, 0 closed; traces: 1/0)
collective_timeout 0/1 rank event a collective's watchdog timed out
    nccl_timeout@hook
exit_code code rank event the rank's process ended (negative: killed by that signal)
collateral 0/1 rank event the exit was caused by a peer's failure
launched 0/1 rank event the rank's process was (re)launched
closing 0/1 rank event the rank's training loop ended and it is shutting down
recovering 0/1 rank event the job was stopped to recover (traces recorded from runs)
replicas count rank gauge replicas whose gradients made the step (replica mode)
epoch count rank counter the quorum's membership epoch the step ran in (replica mode)
exchange_retries count rank counter retries of the step's gradient exchange (replica mode)
catch_up 0/1 rank event the rank's replica is catching up from a peer (replica mode)
serving_catch_up 0/1 rank event the rank serves a catching-up peer (replica mode)
replayed_steps count rank counter steps a rejoining replica replayed (replica mode)
batch count rank counter index of the data batch the replica trained on (replica mode)
nccl_last_seq count rank gauge highest collective sequence number the rank entered
nccl_pending_collective seq rank event a flight-recorder dump: the rank waits in that collective
nccl_rank_behind seq rank event a flight-recorder dump: the rank never entered that collective
gpu_util % gpu gauge GPU duty cycle (reads 100 % while spinning in a collective too)
    gpu_util_pct@nvml DCGM_FI_DEV_GPU_UTIL@dcgm
gpu_mem_util % gpu gauge memory-interface duty cycle
    gpu_mem_util_pct@nvml DCGM_FI_DEV_MEM_COPY_UTIL@dcgm
mem_used GB gpu gauge device memory used (GB = 10^9 bytes)
    gpu_mem_used_bytes*1e-9@nvml DCGM_FI_DEV_FB_USED*0.001048576@dcgm gpu_mem_used*1e-9@export
    mem_used_bytes*1e-9@unit mem_used_mib*0.001048576@unit
mem_free GB gpu gauge device memory free
    DCGM_FI_DEV_FB_FREE*0.001048576@dcgm
mem_reserved GB gpu gauge device memory reserved by the driver
    DCGM_FI_DEV_FB_RESERVED*0.001048576@dcgm
mem_total GB gpu gauge device memory in all
    gpu_mem_total_bytes*1e-9@nvml
gpu_temp °C gpu gauge GPU temperature
    gpu_temp_c@nvml DCGM_FI_DEV_GPU_TEMP@dcgm
gpu_mem_temp °C gpu gauge device memory temperature
    DCGM_FI_DEV_MEMORY_TEMP@dcgm
power W gpu gauge power draw
    gpu_power_w@nvml DCGM_FI_DEV_POWER_USAGE@dcgm gpu_power@export
energy J gpu counter energy used since boot
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION*1e-3@dcgm
sm_clock MHz gpu gauge SM clock (falls when the GPU throttles)
    gpu_sm_clock_mhz@nvml DCGM_FI_DEV_SM_CLOCK@dcgm
mem_clock MHz gpu gauge memory clock
    gpu_mem_clock_mhz@nvml DCGM_FI_DEV_MEM_CLOCK@dcgm
throttle_reasons bitmask gpu gauge clock-event (throttle) reasons, NVML's bits
    gpu_throttle_reasons@nvml DCGM_FI_DEV_CLOCK_THROTTLE_REASONS@dcgm
    DCGM_FI_DEV_CLOCKS_EVENT_REASONS@dcgm
throttle_thermal 0/1 gpu gauge a thermal slowdown reason is set
    gpu_throttle_thermal@nvml
throttle_power 0/1 gpu gauge a power-cap or power-brake reason is set
    gpu_throttle_power@nvml
thermal_violation s gpu counter time throttled for heat
    DCGM_FI_DEV_THERMAL_VIOLATION*1e-9@dcgm
power_violation s gpu counter time throttled for power
    DCGM_FI_DEV_POWER_VIOLATION*1e-9@dcgm
ecc_sbe count gpu counter single-bit (corrected) ECC errors since the driver loaded
    gpu_ecc_corrected_total@nvml DCGM_FI_DEV_ECC_SBE_VOL_TOTAL@dcgm
ecc_dbe count gpu counter double-bit (uncorrected) ECC errors since the driver loaded
    gpu_ecc_uncorrected_total@nvml DCGM_FI_DEV_ECC_DBE_VOL_TOTAL@dcgm
ecc_sbe_agg count gpu counter single-bit ECC errors over the GPU's life
    DCGM_FI_DEV_ECC_SBE_AGG_TOTAL@dcgm
ecc_dbe_agg count gpu counter double-bit ECC errors over the GPU's life
    DCGM_FI_DEV_ECC_DBE_AGG_TOTAL@dcgm
retired_pages_sbe count gpu counter pages retired for single-bit errors
    DCGM_FI_DEV_RETIRED_SBE@dcgm
retired_pages_dbe count gpu counter pages retired for double-bit errors
    DCGM_FI_DEV_RETIRED_DBE@dcgm
retired_pages_pending count gpu gauge pages waiting to be retired
    DCGM_FI_DEV_RETIRED_PENDING@dcgm
remapped_rows_correctable count gpu counter rows remapped for correctable errors
    gpu_remapped_rows_correctable@nvml DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS@dcgm
remapped_rows_uncorrectable count gpu counter rows remapped for uncorrectable errors
    gpu_remapped_rows_uncorrectable@nvml DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS@dcgm
row_remap_pending 0/1 gpu gauge a row remap waits for a GPU reset
    gpu_remap_pending@nvml
row_remap_failure 0/1 gpu gauge the GPU could not remap a row
    gpu_remap_failure@nvml DCGM_FI_DEV_ROW_REMAP_FAILURE@dcgm
pcie_replays count gpu counter PCIe replays (retries)
    gpu_pcie_replays_total@nvml DCGM_FI_DEV_PCIE_REPLAY_COUNTER@dcgm
nvlink_replay_errors count gpu counter NVLink replays, summed over links
    gpu_nvlink_replay_errors_total@nvml DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL@dcgm
nvlink_recovery_errors count gpu counter NVLink recoveries, summed over links
    gpu_nvlink_recovery_errors_total@nvml DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL@dcgm
nvlink_crc_flit_errors count gpu counter NVLink flow-control CRC errors, summed over links
    gpu_nvlink_crc_flit_errors_total@nvml DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL@dcgm
nvlink_crc_data_errors count gpu counter NVLink data CRC errors, summed over links
    gpu_nvlink_crc_data_errors_total@nvml DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL@dcgm
nvlink_bandwidth count gpu counter NVLink bandwidth counter, all lanes
    DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL@dcgm
enc_util % gpu gauge video encoder duty cycle
    DCGM_FI_DEV_ENC_UTIL@dcgm
dec_util % gpu gauge video decoder duty cycle
    DCGM_FI_DEV_DEC_UTIL@dcgm
board_limit_violation s gpu counter time throttled by a board limit
    DCGM_FI_DEV_BOARD_LIMIT_VIOLATION*1e-9@dcgm
low_util_violation s gpu counter time throttled for low utilisation
    DCGM_FI_DEV_LOW_UTIL_VIOLATION*1e-9@dcgm
reliability_violation s gpu counter time throttled for reliability
    DCGM_FI_DEV_RELIABILITY_VIOLATION*1e-9@dcgm
sync_boost_violation s gpu counter time throttled by sync boost
    DCGM_FI_DEV_SYNC_BOOST_VIOLATION*1e-9@dcgm
clock_events count gpu counter clock events (throttling) dcgm-exporter saw
    DCGM_EXP_CLOCK_EVENTS_COUNT@dcgm
gpu_health code gpu gauge DCGM's health verdict for the GPU
    DCGM_EXP_GPU_HEALTH_STATUS@dcgm
p2p_status code gpu gauge peer-to-peer NVLink status
    DCGM_EXP_P2P_STATUS@dcgm
vgpu_license_status code gpu gauge vGPU licence status
    DCGM_FI_DEV_VGPU_LICENSE_STATUS@dcgm
xid code gpu event an XID the GPU reported (sticky in dcgm-exporter: a change is the event)
    gpu_xid@nvml DCGM_FI_DEV_XID_ERRORS@dcgm
xid_count count gpu gauge XIDs in dcgm-exporter's window
    DCGM_EXP_XID_ERRORS_COUNT@dcgm
gr_engine_active % gpu gauge time the graphics engine is active
    DCGM_FI_PROF_GR_ENGINE_ACTIVE*100@dcgm
sm_active % gpu gauge cycles with a warp resident on an SM
    DCGM_FI_PROF_SM_ACTIVE*100@dcgm
sm_occupancy % gpu gauge resident warps over the maximum
    DCGM_FI_PROF_SM_OCCUPANCY*100@dcgm
tensor_active % gpu gauge cycles the tensor pipe is active
    DCGM_FI_PROF_PIPE_TENSOR_ACTIVE*100@dcgm
fp16_active % gpu gauge cycles the FP16 pipe is active
    DCGM_FI_PROF_PIPE_FP16_ACTIVE*100@dcgm
fp32_active % gpu gauge cycles the FP32 pipe is active
    DCGM_FI_PROF_PIPE_FP32_ACTIVE*100@dcgm
fp64_active % gpu gauge cycles the FP64 pipe is active
    DCGM_FI_PROF_PIPE_FP64_ACTIVE*100@dcgm
dram_active % gpu gauge cycles the device memory interface is busy
    DCGM_FI_PROF_DRAM_ACTIVE*100@dcgm
pcie_tx_rate B/s gpu gauge PCIe bytes sent per second
    DCGM_FI_PROF_PCIE_TX_BYTES@dcgm
pcie_rx_rate B/s gpu gauge PCIe bytes received per second
    DCGM_FI_PROF_PCIE_RX_BYTES@dcgm
nvlink_tx_rate B/s gpu gauge NVLink bytes sent per second
    DCGM_FI_PROF_NVLINK_TX_BYTES@dcgm
nvlink_rx_rate B/s gpu gauge NVLink bytes received per second
    DCGM_FI_PROF_NVLINK_RX_BYTES@dcgm
nic_gbps Gbit/s node gauge the node's NIC throughput (low is bad while the job trains)
    nic_mbps*1e-3@unit nic_bytes_per_s*8e-9@unit
host_cpu % node gauge host CPU busy
    host_cpu_util_pct@host
host_cpu_iowait % node gauge host CPU waiting for I/O
    host_cpu_iowait_pct@host
host_load1 - node gauge one-minute load average
host_cpu_count count node gauge logical CPUs
host_mem_used GB node gauge host memory in use (total less available)
    host_mem_used_bytes*1e-9@host
host_mem_available GB node gauge host memory available
    host_mem_available_bytes*1e-9@host
host_mem_total GB node gauge host memory in all
    host_mem_total_bytes*1e-9@host
host_swap_used GB node gauge swap in use
    host_swap_used_bytes*1e-9@host
host_disk_used % node gauge disk space used
    host_disk_used_pct@host
host_disk_read B node counter bytes read from disk
    host_disk_read_bytes_total@host
host_disk_written B node counter bytes written to disk
    host_disk_written_bytes_total@host
nic_rx_bytes B node counter bytes a NIC received
    host_net_rx_bytes_total@host
nic_tx_bytes B node counter bytes a NIC sent
    host_net_tx_bytes_total@host
nic_rx_errors count node counter receive errors of a NIC
    host_net_rx_errors_total@host
nic_tx_errors count node counter send errors of a NIC
    host_net_tx_errors_total@host
nic_rx_drops count node counter received packets a NIC dropped
    host_net_rx_drops_total@host
nic_tx_drops count node counter outgoing packets a NIC dropped
    host_net_tx_drops_total@host
nic_up 0/1 node gauge the NIC's link is up
    host_net_up@host
"""

Row = tuple[str, str, str, str, str, tuple[tuple[str, float, str], ...]]


def _alias(token: str) -> tuple[str, float, str]:
    name_scale, _, source = token.partition("@")
    name, _, scale = name_scale.partition("*")
    return name, float(scale or 1.0), source


def parse(text: str) -> tuple[Row, ...]:
    """Rows ``(name, unit, scope, kind, help, aliases)`` of a table in the format above."""
    rows: list[Row] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith(" "):
            name, unit, scope, kind, help_text, aliases = rows.pop()
            aliases += tuple(_alias(t) for t in line.split())
            rows.append((name, unit, scope, kind, help_text, aliases))
            continue
        name, unit, scope, kind, help_text = line.split(maxsplit=4)
        rows.append((name, "" if unit == "-" else unit, scope, kind, help_text, ()))
    return tuple(rows)


TABLE: tuple[Row, ...] = parse(_TEXT)
