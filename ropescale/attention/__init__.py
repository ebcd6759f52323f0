"""ropescale.attention"""
