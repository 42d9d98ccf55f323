"""ROS 2 bags (rosbag2: MCAP or SQLite), .mcap files and ROS 1 .bag files -> tables."""

from treadle.importers.ros2.ros2_import import import_ros2

__all__ = ["import_ros2"]
