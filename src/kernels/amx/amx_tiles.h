/*
 * amx_tiles.h - the AMX tile configuration record (LDTILECFG's 64-byte operand).
 *
 * A configuration must live in static storage: GCC 12's _tile_loadconfig tells the compiler
 * it reads only the first bytes of its operand, so stores into a local record may be dropped
 * (the tiles then keep zero rows and the first tile instruction faults).
 * LDTILECFG is per thread and cheap next to a tile loop, but not next to one microkernel
 * call: loops load it once per block of work (dg_engine_cfg.ukr_begin), and never assume it
 * survives other code (another library may TILERELEASE between our calls).
 */
#ifndef DG_KERNELS_AMX_TILES_H
#define DG_KERNELS_AMX_TILES_H

#include <stdint.h>

typedef struct dg_amx_tilecfg {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of tile t */
    uint8_t rows[16];
} dg_amx_tilecfg;

#endif /* DG_KERNELS_AMX_TILES_H */
